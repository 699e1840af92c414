//! `boxd-host mcp`: the component's tools over MCP on stdio. (Being built.)

use anyhow::{bail, Result};

use crate::cli::Flags;

pub fn serve(_flags: &Flags) -> Result<u8> {
    bail!("the MCP server is not built yet")
}
