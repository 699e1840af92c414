//! The ledger: what the laptop knows about each work, under `<ledger>/works/<id>/`.
//!
//! One JSON record per work (`work.json`, with a schema version), written atomically
//! through the `Files` capability (temp file, sync, rename), so a crash at any point
//! leaves the previous record readable. It holds names, sizes and digests, never file
//! contents; the only secret, the guest server's password, sits in its own file.
//! Stored patches and exports live beside it, named by digest.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::caps::{Files, FsError};
use crate::errors::{Code, ToolError, ToolResult};
use crate::paths;

pub const SCHEMA: u32 = 1;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Work {
    pub schema: u32,
    pub work: String,
    pub machine: String,
    /// The id boxd returned at create; None until boxd has answered.
    pub machine_id: Option<String>,
    /// The laptop folder the work belongs to.
    pub directory: String,
    pub created_at: String,
    /// creating → open → closed (dropped).
    pub state: String,
    #[serde(default)]
    pub prompts: Vec<Prompt>,
    #[serde(default)]
    pub files_in: Vec<FileRecord>,
    #[serde(default)]
    pub files_out: Vec<FileRecord>,
    #[serde(default)]
    pub proofs: Vec<Proof>,
    #[serde(default)]
    pub sleeps: Vec<Sleep>,
    #[serde(default)]
    pub warnings: Vec<String>,
    #[serde(default)]
    pub git: Option<GitRecord>,
    /// sha256 of the guest helper uploaded for this work.
    #[serde(default)]
    pub helper_sha256: Option<String>,
    /// boxd_sleep put the machine down and nothing has seen it awake since: boxd_job
    /// then says `asleepBy: boxd_sleep` (else the idle bound or the CLI did).
    #[serde(default)]
    pub asleep_by_tool: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Prompt {
    pub id: String,
    pub at: String,
    pub sha256: String,
    pub bytes: u64,
    /// False until the guest admitted it; recorded before sending, so a prompt whose
    /// fate is unknown still counts against the proof.
    #[serde(default)]
    pub admitted: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileRecord {
    /// The guest path, relative to the work tree.
    pub guest: String,
    /// The laptop path.
    pub laptop: String,
    pub size: u64,
    pub sha256: String,
    pub at: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionProof {
    pub id: String,
    pub parent_id: Option<String>,
    pub messages: u64,
    pub digest: String,
    /// The stored export (in the work's ledger folder) this proof was made from.
    #[serde(default)]
    pub file: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Proof {
    pub at: String,
    /// How many prompts of the work this proof covers.
    pub prompts: u64,
    pub sessions: Vec<SessionProof>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sleep {
    pub by: String,
    pub at: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GitEntry {
    pub path: String,
    pub sha256: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GitRecord {
    pub at: String,
    pub head: String,
    pub branch: String,
    pub status: Vec<String>,
    pub untracked: Vec<GitEntry>,
    pub ignored: Vec<GitEntry>,
    pub dirty: bool,
    /// The stored patch (file name in the work's folder), when the tree had changes.
    pub patch: Option<String>,
    /// How many prompts the record covers.
    pub prompts: u64,
}

impl Work {
    pub fn new(work: &str, directory: &str, now: &str) -> Work {
        Work {
            schema: SCHEMA,
            work: work.to_string(),
            machine: paths::machine_name(work),
            directory: directory.to_string(),
            created_at: now.to_string(),
            state: "creating".to_string(),
            ..Default::default()
        }
    }

    /// The newest proof covers every prompt made so far.
    pub fn proven(&self) -> bool {
        self.proofs.last().is_some_and(|p| p.prompts >= self.prompts.len() as u64)
    }

    pub fn is_closed(&self) -> bool {
        self.state == "closed"
    }
}

fn ledger_error(what: &str, e: FsError) -> ToolError {
    let detail = match e {
        FsError::Refused(p) => format!("{p} is outside the ledger folder the host granted"),
        FsError::Io(m) => m,
    };
    ToolError::new(Code::LedgerFailed, format!("could not {what}: {detail}"))
}

/// The ledger folder, through the `Files` capability.
pub struct Ledger<'a, F: Files> {
    files: &'a mut F,
    root: String,
}

impl<'a, F: Files> Ledger<'a, F> {
    pub fn new(files: &'a mut F, root: &str) -> Self {
        Self { files, root: root.to_string() }
    }

    pub fn files(&mut self) -> &mut F {
        self.files
    }

    pub fn work_dir(&self, work: &str) -> String {
        format!("{}/works/{work}", self.root.trim_end_matches('/'))
    }

    fn record_path(&self, work: &str) -> String {
        format!("{}/work.json", self.work_dir(work))
    }

    /// One work's record, or None when the ledger has never seen it.
    pub fn read(&mut self, work: &str) -> ToolResult<Option<Work>> {
        let path = self.record_path(work);
        let bytes = self.files.read(&path).map_err(|e| ledger_error("read the ledger", e))?;
        let Some(bytes) = bytes else { return Ok(None) };
        let w: Work = serde_json::from_slice(&bytes).map_err(|e| {
            ToolError::new(Code::LedgerFailed, format!("{path} is not a ledger record ({e}); it was left as it is"))
        })?;
        if w.schema > SCHEMA {
            return Err(ToolError::with_next(
                Code::LedgerFailed,
                format!("{path} has schema {} but this plugin reads up to {SCHEMA}", w.schema),
                "Update the plugin to the version that wrote this ledger.",
            ));
        }
        Ok(Some(w))
    }

    /// A work the tool needs to exist.
    pub fn require(&mut self, work: &str) -> ToolResult<Work> {
        self.read(work)?.ok_or_else(|| {
            ToolError::new(Code::WorkUnknown, format!("the ledger has no work '{work}'"))
        })
    }

    pub fn write(&mut self, w: &Work) -> ToolResult<()> {
        let dir = self.work_dir(&w.work);
        self.files.create_dir_all(&dir).map_err(|e| ledger_error("create the work's ledger folder", e))?;
        let mut bytes = serde_json::to_vec_pretty(w).expect("a ledger record always serialises");
        bytes.push(b'\n');
        self.files.write_atomic(&self.record_path(&w.work), &bytes).map_err(|e| ledger_error("write the ledger", e))
    }

    /// Every work id in the ledger, sorted.
    pub fn ids(&mut self) -> ToolResult<Vec<String>> {
        let dir = format!("{}/works", self.root.trim_end_matches('/'));
        let names = self.files.list(&dir).map_err(|e| ledger_error("list the ledger", e))?;
        Ok(names.into_iter().filter(|n| paths::work_id(n).is_ok()).collect())
    }

    /// Store a blob beside the record (a patch, an export), named by the caller.
    pub fn put_blob(&mut self, work: &str, name: &str, bytes: &[u8]) -> ToolResult<()> {
        let path = format!("{}/{name}", self.work_dir(work));
        self.files.write_atomic(&path, bytes).map_err(|e| ledger_error("store a file in the ledger", e))
    }

    pub fn get_blob(&mut self, work: &str, name: &str) -> ToolResult<Option<Vec<u8>>> {
        let path = format!("{}/{name}", self.work_dir(work));
        self.files.read(&path).map_err(|e| ledger_error("read a file from the ledger", e))
    }

    /// The guest server's password: created once per work, kept in its own file.
    pub fn password(&mut self, work: &str) -> ToolResult<Option<String>> {
        Ok(self.get_blob(work, "password")?.map(|b| String::from_utf8_lossy(&b).trim().to_string()))
    }
}

/// Hours-minutes-seconds UTC from Unix milliseconds, as ISO 8601 (the component has no
/// clock; `now` comes from the host in every call).
pub fn iso8601(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z", rem / 3600, rem % 3600 / 60, rem % 60, ms % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemFiles;

    #[test]
    fn iso_dates() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(1_795_953_600_123), "2026-11-29T12:00:00.123Z");
    }

    #[test]
    fn round_trip_and_listing() {
        let mut fs = MemFiles::new(&["/l"]);
        let mut l = Ledger::new(&mut fs, "/l");
        assert_eq!(l.read("w1").unwrap(), None);
        let w = Work::new("w1", "/p", "t0");
        l.write(&w).unwrap();
        assert_eq!(l.read("w1").unwrap().unwrap(), w);
        assert_eq!(l.ids().unwrap(), ["w1"]);
        assert_eq!(l.require("w2").unwrap_err().code, Code::WorkUnknown);
    }

    #[test]
    fn a_torn_record_is_reported_not_overwritten() {
        let mut fs = MemFiles::new(&["/l"]);
        fs.put("/l/works/w1/work.json", b"{\"schema\":1,\"wor");
        let mut l = Ledger::new(&mut fs, "/l");
        let e = l.read("w1").unwrap_err();
        assert_eq!(e.code, Code::LedgerFailed);
        assert_eq!(fs.text("/l/works/w1/work.json").unwrap(), "{\"schema\":1,\"wor");
    }

    #[test]
    fn unwritable_ledger_is_ledger_failed() {
        let mut fs = MemFiles::new(&["/l"]);
        fs.broken.insert("/l".into());
        let mut l = Ledger::new(&mut fs, "/l");
        assert_eq!(l.write(&Work::new("w1", "/p", "t")).unwrap_err().code, Code::LedgerFailed);
    }

    #[test]
    fn proof_must_cover_every_prompt() {
        let mut w = Work::new("w1", "/p", "t");
        assert!(!w.proven());
        w.proofs.push(Proof { prompts: 0, ..Default::default() });
        assert!(w.proven());
        w.prompts.push(Prompt::default());
        assert!(!w.proven());
    }
}
