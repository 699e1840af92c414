//! `boxd-host call TOOL [ARGS_JSON]`: one tool call; the result or the error object on
//! stdout, exit 1 for a tool error.

use anyhow::{Context as _, Result};

use crate::cli::Grants;
use crate::session::Session;

pub fn run(grants: &Grants, tool: &str, mut args: String) -> Result<u8> {
    if args == "-" {
        // Large arguments (a long prompt) do not fit in argv: read them from stdin.
        args.clear();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut args).context("reading ARGS_JSON from stdin")?;
    }
    let mut session = Session::open(grants, crate::session::HOST_NAME)?;
    let (answer, code) = match session.call(tool, &args)? {
        Ok(v) => (v, 0),
        Err(e) => (e, 1),
    };
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(code)
}
