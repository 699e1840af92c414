//! `boxd-host describe`: the component's manifest, as JSON.

use anyhow::Result;

use crate::cli::Grants;
use crate::session::Session;

pub fn run(grants: &Grants) -> Result<u8> {
    let session = Session::open(grants, crate::session::HOST_NAME)?;
    crate::outln!("{}", session.runtime.describe()?);
    Ok(0)
}
