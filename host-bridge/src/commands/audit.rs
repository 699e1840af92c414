//! `boxd-host audit [--json]`: what the plugin can touch under these grants.

use anyhow::Result;

use crate::cli::Grants;
use crate::session::Session;

pub fn run(grants: &Grants, as_json: bool) -> Result<u8> {
    let session = Session::open(grants, crate::session::HOST_NAME)?;
    let reach = crate::audit::reach(&session.runtime);
    if as_json {
        crate::outln!("{}", serde_json::to_string_pretty(&reach)?);
    } else {
        crate::out!("{}", crate::audit::render(&reach));
    }
    Ok(0)
}
