//! The golden image's build machines, recorded in the ledger before boxd is asked for one:
//! a host killed mid-build leaves a machine that bills until removed, and only a name this
//! ledger wrote down may be removed later (never a look-alike someone else made).

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use super::{ledger_error, Ledger};
use crate::caps::Files;
use crate::errors::ToolResult;

/// One build machine this ledger asked for and has not yet seen removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildMachine {
    pub machine: String,
    /// boxd's id for it, once `machine new` answered (None: the host died before that).
    #[serde(default)]
    pub id: Option<String>,
    /// When the build asked for it (host clock, Unix ms).
    pub started_at_ms: u64,
    /// The build ended but could not remove it: the next build need not wait for it.
    #[serde(default)]
    pub ended: bool,
}

impl<F: Files> Ledger<'_, F> {
    fn builds_dir(&self) -> String {
        format!("{}/golden-builds", self.root.trim_end_matches('/'))
    }

    fn build_path(&self, machine: &str) -> String {
        format!("{}/{machine}.json", self.builds_dir())
    }

    /// Write (or rewrite, with its id) the record of a build machine.
    pub fn note_build_machine(&mut self, m: &BuildMachine) -> ToolResult<()> {
        self.files.create_dir_all(&self.builds_dir()).map_err(|e| ledger_error("create the ledger's build folder", e))?;
        let mut bytes = serde_json::to_vec(m).expect("a build record always serialises");
        bytes.push(b'\n');
        self.files.write_atomic(&self.build_path(&m.machine), &bytes).map_err(|e| ledger_error("record the build machine", e))
    }

    /// The machine is gone (removed, or no longer the one we made): forget it.
    pub fn forget_build_machine(&mut self, machine: &str) -> ToolResult<()> {
        self.files.remove_file(&self.build_path(machine)).map_err(|e| ledger_error("forget the build machine", e))
    }

    /// Every build machine recorded and not yet forgotten. A record that does not parse is
    /// skipped (and left as it is): it names nothing we could safely remove.
    pub fn build_machines(&mut self) -> ToolResult<Vec<BuildMachine>> {
        let dir = self.builds_dir();
        let names = self.files.list(&dir).map_err(|e| ledger_error("list the ledger's build machines", e))?;
        let mut out = Vec::new();
        for name in names.iter().filter(|n| n.ends_with(".json")) {
            let bytes = self.files.read(&format!("{dir}/{name}")).map_err(|e| ledger_error("read a build record", e))?;
            if let Some(m) = bytes.and_then(|b| serde_json::from_slice::<BuildMachine>(&b).ok()) {
                if format!("{}.json", m.machine) == *name {
                    out.push(m);
                }
            }
        }
        Ok(out)
    }
}
