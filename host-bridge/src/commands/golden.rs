//! `boxd-host golden`: build the golden image through the component's `build-golden`
//! operation, so the build's boxd calls are granted by the policy, run by the one process
//! runner and written to the audit log like any tool call's. This file only turns flags
//! into the spec (docs/golden-image.md) and prints the report.

use anyhow::{Context as _, Result};
use serde_json::{json, Value};

use crate::cli::{GoldenArgs, Grants};
use crate::session::Session;

/// The spec the component takes: only what the user gave; the component owns the defaults.
pub fn spec(args: &GoldenArgs) -> Result<Value> {
    let mut spec = json!({ "snapshot": args.name, "keyEnv": args.key_env });
    if let Some(path) = &args.config {
        // The file is the user's to name, anywhere: the host reads it, the component checks it.
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read the config {}", path.display()))?;
        spec["config"] = json!(text);
    }
    for (key, value) in [("opencodeVersion", args.opencode_version.clone()), ("model", args.model.clone()), ("url", args.url.clone())] {
        if let Some(v) = value {
            spec[key] = json!(v);
        }
    }
    if let Some(n) = args.attempts {
        spec["attempts"] = json!(n);
    }
    if let Some(s) = args.retry_delay {
        spec["retryDelaySeconds"] = json!(s);
    }
    Ok(spec)
}

pub fn run(grants: &Grants, args: &GoldenArgs) -> Result<u8> {
    let spec = spec(args)?;
    let mut session = Session::open(grants, crate::session::HOST_NAME)?;
    let (answer, code) = match session.build_golden(&spec)? {
        Ok(report) => {
            for step in report["steps"].as_array().into_iter().flatten() {
                eprintln!("golden: {}", step.as_str().unwrap_or_default());
            }
            (report, 0)
        }
        Err(e) => (e, 1),
    };
    crate::outln!("{}", serde_json::to_string_pretty(&answer)?);
    // As `call`: an audit line that could not be written (stderr said why) is a host failure.
    Ok(if session.audit.failed().is_some() { 2 } else { code })
}
