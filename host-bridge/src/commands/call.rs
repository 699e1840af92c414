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
    let mut session = match Session::open(grants, crate::session::HOST_NAME) {
        Ok(s) => s,
        // A grant the host cannot make (a relative ledgerDir, a missing allowed root) is
        // answered in the tools' own shape, as the OpenCode bridge answers every call.
        Err(e) => match e.downcast_ref::<crate::policy::HostProblem>() {
            Some(p) => {
                println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "error": p.code, "message": p.message, "next": p.next }))?);
                return Ok(1);
            }
            None => return Err(e),
        },
    };
    let (answer, code) = match session.call(tool, &args)? {
        Ok(v) => (v, 0),
        Err(e) => (e, 1),
    };
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(code)
}
