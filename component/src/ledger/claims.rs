//! Admission claims: a create, fork or wake that is being admitted, or whose machine may be
//! coming, under `<ledger>/admission/`. A call writes its claim before it reads what runs,
//! and every admission counts the other calls' fresh claims as running, so two calls at
//! once see each other (tools/admission.rs). One file per call and work, written whole
//! (temp file, rename), removed once the machine is counted another way (listed by boxd,
//! or its run recorded) or nothing was made. A claim of a host killed midway counts for at
//! most `CLAIM_MS`, then the next reader removes it.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use super::{ledger_error, Ledger, IN_FLIGHT_MS};
use crate::caps::Files;
use crate::errors::ToolResult;

/// How long a claim counts: the bound on a call still carrying its create, fork or wake
/// (the same as a prompt that may still be on its way).
pub const CLAIM_MS: u64 = IN_FLIGHT_MS;

/// One machine a call is starting (or may have started) for a work of this ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    pub work: String,
    /// The work's laptop folder (the project cap counts by it).
    pub directory: String,
    /// The machine size it bills at (the burn ceiling counts by it).
    pub size: String,
    /// A wake of a machine boxd lists asleep: the listing says nothing of it until it is up.
    #[serde(default)]
    pub wake: bool,
    /// When the call began (host clock, Unix ms).
    pub at_ms: u64,
}

/// A claim written by this call: its file, to release.
#[derive(Debug)]
pub struct Held(String);

impl<F: Files> Ledger<'_, F> {
    fn claims_dir(&self) -> String {
        format!("{}/admission", self.root.trim_end_matches('/'))
    }

    /// Write this call's claim for `c.work` (whole, or not at all).
    pub fn claim(&mut self, c: &Claim) -> ToolResult<Held> {
        let dir = self.claims_dir();
        self.files.create_dir_all(&dir).map_err(|e| ledger_error("create the ledger's admission folder", e))?;
        let path = format!("{dir}/{}.{}.claim", c.work, self.owner.replace(':', "-"));
        let mut bytes = serde_json::to_vec(c).expect("a claim always serialises");
        bytes.push(b'\n');
        self.files.write_atomic(&path, &bytes).map_err(|e| ledger_error("record an admission claim", e))?;
        Ok(Held(path))
    }

    /// Remove this call's claim (a claim that cannot be removed stops counting with age).
    pub fn release(&mut self, held: Held) {
        let _ = self.files.remove_file(&held.0);
    }

    /// Every claim younger than CLAIM_MS at `now_ms` (this call's own too). Older ones
    /// (and ones dated past now by more than that: a clock that jumped) are a killed call's,
    /// and are removed; one that does not parse is skipped (a temp file, or not ours).
    pub fn claims(&mut self, now_ms: u64) -> ToolResult<Vec<Claim>> {
        let dir = self.claims_dir();
        let names = self.files.list(&dir).map_err(|e| ledger_error("list the ledger's admission claims", e))?;
        let mut out = Vec::new();
        for name in names.iter().filter(|n| n.ends_with(".claim")) {
            let path = format!("{dir}/{name}");
            let Some(c) = self.files.read(&path).ok().flatten().and_then(|b| serde_json::from_slice::<Claim>(&b).ok()) else { continue };
            if super::waited(c.at_ms, CLAIM_MS, now_ms) {
                let _ = self.files.remove_file(&path);
                continue;
            }
            if name.starts_with(&format!("{}.", c.work)) {
                out.push(c);
            }
        }
        Ok(out)
    }
}
