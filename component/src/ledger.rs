//! The ledger: what the laptop knows about each work, under `<ledger>/works/<id>/`.
//!
//! One JSON record per work (`work.json`, with a schema version), written atomically
//! through the `Files` capability (temp file, sync, rename), so a crash at any point
//! leaves the previous record readable. It holds names, sizes and digests, never file
//! contents; the only secret, the guest server's password, sits in its own file.
//! Stored patches and exports live beside it, named by digest.
//!
//! Many writers may share a ledger (the CLI, the MCP server, OpenCode's worker pool), so
//! every change is a read-modify-write under the work's lock (`update`): an exclusive
//! create of `lock` naming its owner, held only for the read and the write — never across
//! a remote call. The component has no clock, so a dead owner is recognised by a lock
//! whose content stays the same through `LOCK_PATIENCE` attempts; it is then renamed away
//! (only one breaker can win the rename) and the attempt starts over. A live owner taken
//! for dead (a sync that stalled for seconds) never writes over the breaker's change: its
//! record is staged and synced first, then renamed into place only while the lock still
//! names it (otherwise the write fails as a killed host's would).

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde::Deserialize;

use crate::caps::{Files, FsError};
use crate::errors::{Code, ToolError, ToolResult};
use crate::paths;

mod builds;
mod claims;
mod spend;
mod summary;
pub use builds::BuildMachine;
pub use claims::{Claim, Held, CLAIM_MS};
pub use spend::{amount, micros, Prices, RunInterval, Settled, MACHINE_SIZE};

pub const SCHEMA: u32 = 1;

/// Attempts that see one unchanged lock before its owner is taken as dead. A live owner
/// holds the lock for one read and one write (milliseconds); this many attempts take
/// seconds on either host.
pub const LOCK_PATIENCE: u32 = 100_000;
/// The largest record a call reads (a record of thousands of prompts is a few MiB).
pub const RECORD_MAX: usize = 64 << 20;
/// Attempts in all before the call gives up with LEDGER_FAILED.
const LOCK_GIVE_UP: u32 = 4_000_000;

mod record;
pub use record::*;


fn ledger_error(what: &str, e: FsError) -> ToolError {
    // A refusal (the path is a symlink, not a regular file or folder, or not ours to read
    // and write) and a file too large to be a record are the ledger's contents, changed
    // from outside: a writable folder and a restarted host change nothing there.
    let refused = "Look at the path named: in the ledger folder, a symbolic link, a FIFO or other special file, a folder where a record belongs, or a file you may not read and write is refused. Put the work's own file back there (or fix its permissions), then call again.";
    let detail = match e {
        FsError::Refused(p) if p.starts_with('/') => {
            return ToolError::with_next(Code::LedgerFailed, format!("could not {what}: {p} was refused: it is outside the ledger folder the host granted, a symlink, not a regular file, or not permitted"), refused);
        }
        // The filesystem's own refusal ("not-permitted: …"), which names no path.
        FsError::Refused(why) => return ToolError::with_next(Code::LedgerFailed, format!("could not {what}: the laptop refused it ({why})"), refused),
        FsError::Io(m) if m.contains(" MiB, more than it may") => {
            return ToolError::with_next(
                Code::LedgerFailed,
                format!("could not {what}: {m} (a record the plugin writes stays under {} MiB)", RECORD_MAX >> 20),
                "Move that file out of the ledger folder and put the work's record back from a backup; boxd_status lists the other works meanwhile.",
            );
        }
        FsError::Io(m) => m,
    };
    // A full disk (WASI's `insufficient-space`, `quota`): restarting changes nothing.
    // (The adapter's text starts with WASI's code name: wasm.rs `io`.)
    if detail.starts_with("insufficient-space:") || detail.starts_with("quota:") {
        return ToolError::with_next(
            Code::LedgerFailed,
            format!("could not {what}: {detail} (the disk holding the ledger folder is full)"),
            "Free space on the disk that holds the ledger folder, then call again: a write that failed recorded nothing.",
        );
    }
    ToolError::new(Code::LedgerFailed, format!("could not {what}: {detail}"))
}

/// The ledger folder, through the `Files` capability.
pub struct Ledger<'a, F: Files> {
    files: &'a mut F,
    root: String,
    /// Written into the lock file: who holds it (unique per call).
    owner: String,
}

impl<'a, F: Files> Ledger<'a, F> {
    pub fn new(files: &'a mut F, root: &str) -> Self {
        Self { files, root: root.to_string(), owner: "unnamed".to_string() }
    }

    /// The ledger for one tool call: its lock owner is named from the call's entropy.
    pub fn for_call(files: &'a mut F, ctx: &crate::options::Context) -> Self {
        let mut seed = ctx.entropy.clone();
        seed.extend_from_slice(b"ledger-lock");
        let owner = format!("{}:{}", ctx.host_name, &crate::encode::sha256_hex(&seed)[..16]);
        Self { files, root: ctx.ledger.clone(), owner }
    }

    fn lock_path(&self, work: &str) -> String {
        format!("{}/lock", self.work_dir(work))
    }

    fn lock(&mut self, work: &str) -> ToolResult<()> {
        let path = self.lock_path(work);
        self.lock_at(work, &path)
    }

    /// Take the lock file `path` in the work's folder (see `lock`).
    fn lock_at(&mut self, work: &str, path: &str) -> ToolResult<()> {
        self.files.create_dir_all(&self.work_dir(work)).map_err(|e| ledger_error("create the work's ledger folder", e))?;
        let path = path.to_string();
        let mine = format!("{{\"owner\":\"{}\"}}\n", self.owner);
        let (mut seen, mut same) = (None::<Vec<u8>>, 0u32);
        for _ in 0..LOCK_GIVE_UP {
            if self.files.create_new(&path, mine.as_bytes()).map_err(|e| ledger_error("lock the work's record", e))? {
                return Ok(());
            }
            let now = self.files.read(&path).ok().flatten();
            if now.is_some() && now == seen {
                same += 1;
            } else {
                (seen, same) = (now, 0);
            }
            if same >= LOCK_PATIENCE {
                // The owner died holding it: move it aside (one breaker wins the rename) and
                // retry. If what moved is not the lock we watched (its owner released it and
                // another call took it in between), put that live lock back at once.
                let aside = format!("{path}.dead-{}", self.owner.replace(':', "-"));
                if self.files.rename(&path, &aside).unwrap_or(false) {
                    let moved = self.files.read(&aside).ok().flatten();
                    if moved.is_some() && moved != seen {
                        let _ = self.files.create_new(&path, moved.as_deref().unwrap_or_default());
                    }
                    let _ = self.files.remove_file(&aside);
                }
                (seen, same) = (None, 0);
            }
        }
        Err(ToolError::new(Code::LedgerFailed, format!("{path} stayed locked by other calls; nothing was changed")))
    }

    fn unlock(&mut self, work: &str) {
        if self.holds_lock(work) {
            let _ = self.files.remove_file(&self.lock_path(work));
        }
    }

    /// Run `f` holding the work's `<name>.lock` (the record's lock machinery, beside it):
    /// for a change that spans records, such as numbering a parent's forks. `f` may take
    /// record locks; nothing takes this lock while holding one.
    pub fn serialized<T>(&mut self, work: &str, name: &str, f: impl FnOnce(&mut Self) -> ToolResult<T>) -> ToolResult<T> {
        let path = format!("{}/{name}.lock", self.work_dir(work));
        self.lock_at(work, &path)?;
        let result = f(self);
        if self.holds(&path) {
            let _ = self.files.remove_file(&path);
        }
        result
    }

    /// Read-modify-write under the work's lock: `f` sees the record as it is now (None
    /// when the ledger has none) and returns the record to write, or None to write
    /// nothing. Returns what was written (or read).
    pub fn upsert(&mut self, work: &str, f: impl FnOnce(Option<Work>) -> ToolResult<Option<Work>>) -> ToolResult<Option<Work>> {
        self.lock(work)?;
        self.sweep_staged(work);
        let result = (|| {
            let current = self.read(work)?;
            let before = current.clone();
            match f(current)? {
                Some(w) => {
                    if before.as_ref() != Some(&w) {
                        self.write_unlocked(&w)?;
                    }
                    Ok(Some(w))
                }
                None => Ok(before),
            }
        })();
        self.unlock(work);
        result
    }

    /// `upsert` for a work that must exist: `f` changes it in place.
    pub fn update(&mut self, work: &str, f: impl FnOnce(&mut Work)) -> ToolResult<Work> {
        let unknown = self.unknown(work);
        let w = self.upsert(work, |cur| {
            let mut w = cur.ok_or(unknown)?;
            f(&mut w);
            Ok(Some(w))
        })?;
        Ok(w.expect("update always writes a record"))
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
        let Some(bytes) = self.record_bytes(&path)? else { return Ok(None) };
        let w = parse_record(&path, &bytes)?;
        self.belongs(&path, work, &w)?;
        Ok(Some(w))
    }

    /// A record is the work its folder names, on the machine this plugin names that work:
    /// a tool checks the record's machine and acts on the name its argument gives, so a
    /// folder copied or renamed by hand (or a `work`/`machine` edited) would have it check
    /// one machine and act on another, and status count one work twice.
    fn belongs(&self, path: &str, work: &str, w: &Work) -> ToolResult<()> {
        let own = paths::machine_name(work);
        if w.work != work {
            return Err(ToolError::with_next(
                Code::LedgerFailed,
                format!("{path} holds the record of work '{}' (machine {}), not of work '{work}': its folder was copied or renamed by hand; nothing was touched", w.work, w.machine),
                format!(
                    "Put the folder back where it belongs: rename {} to {} if that folder does not exist, else move it out of the ledger (it is a copy); then call again.",
                    self.work_dir(work),
                    self.work_dir(&w.work)
                ),
            ));
        }
        if w.machine != own {
            return Err(ToolError::with_next(
                Code::LedgerFailed,
                format!("{path} names machine {} for work '{work}', but this plugin names that work's machine {own}: the record was edited by hand; nothing was touched", w.machine),
                format!("Set \"machine\" in {path} back to \"{own}\", then call again."),
            ));
        }
        Ok(())
    }

    /// What boxd_status shows of a work: the record with every field status does not read
    /// left empty (ledger/summary.rs). Never to be written back. A record the summary
    /// cannot take is read in full, so its error is the full read's.
    pub fn summary(&mut self, work: &str) -> ToolResult<Option<Work>> {
        let path = self.record_path(work);
        let Some(bytes) = self.record_bytes(&path)? else { return Ok(None) };
        let w = match serde_json::from_slice::<summary::Summary>(&bytes) {
            Ok(s) if s.schema <= SCHEMA => s.into_work(),
            _ => parse_record(&path, &bytes)?,
        };
        self.belongs(&path, work, &w)?;
        Ok(Some(w))
    }

    /// A record's bytes, up to RECORD_MAX: one grown past that (or replaced by a huge file)
    /// is that work's error, never the whole call's (the component's memory is bounded).
    fn record_bytes(&mut self, path: &str) -> ToolResult<Option<Vec<u8>>> {
        self.files.read_at_most(path, RECORD_MAX).map_err(|e| ledger_error("read the ledger", e))
    }

    /// A work the tool needs to exist.
    pub fn require(&mut self, work: &str) -> ToolResult<Work> {
        match self.read(work)? {
            Some(w) => Ok(w),
            None => Err(self.unknown_here(work)),
        }
    }

    /// WORK_UNKNOWN, or, where the work's folder still holds its machine's password, the
    /// record removed from it: boxd_ensure would refuse that machine as not this ledger's
    /// (its next step sent the user there), so the step is to put the record back.
    fn unknown_here(&mut self, work: &str) -> ToolError {
        if !self.record_removed(work) {
            return self.unknown(work);
        }
        let dir = self.work_dir(work);
        ToolError::with_next(
            Code::WorkUnknown,
            format!("the ledger at {} has no record of work '{work}', but {dir} still holds its machine's password: the record (work.json) was removed or moved", self.root),
            self.put_record_back(work),
        )
    }

    /// Whether the work's folder holds its machine's password but no record: this ledger
    /// prepared that machine, and its record was removed from outside (callers have found
    /// no record).
    pub fn record_removed(&mut self, work: &str) -> bool {
        matches!(self.files.stat(&format!("{}/password", self.work_dir(work))), Ok(Some(_)))
    }

    /// The step for a record removed beside its machine's password (`record_removed`).
    pub fn put_record_back(&self, work: &str) -> String {
        let (dir, machine) = (self.work_dir(work), crate::paths::machine_name(work));
        format!("Put {dir}/work.json back from a backup, then call again. With no backup, remove {machine} yourself ('boxd machine remove {machine} -y') once nothing on it is wanted, then move {dir} out of the ledger.")
    }

    /// WORK_UNKNOWN for `work`, naming this ledger (another ledger may hold it).
    pub fn unknown(&self, work: &str) -> ToolError {
        ToolError::new(Code::WorkUnknown, format!("the ledger at {} has no work '{work}'", self.root))
    }

    /// Write a whole record under its lock (callers that just read it and own the change).
    pub fn write(&mut self, w: &Work) -> ToolResult<()> {
        let w = w.clone();
        self.upsert(&w.work.clone(), move |_| Ok(Some(w))).map(|_| ())
    }

    /// Remove staged copies of the record (and their temps) another writer left: only a
    /// lock holder stages one, so while this call holds the lock they are a killed host's
    /// (never renamed) or a broken-lock holder's (refused at its rename anyway).
    fn sweep_staged(&mut self, work: &str) {
        let dir = self.work_dir(work);
        let own = format!("work.json.{}.next", self.owner.replace(':', "-"));
        for name in self.files.list(&dir).unwrap_or_default() {
            let staged = name.strip_prefix("work.json.").is_some_and(|rest| rest.ends_with(".next") || rest.contains(".next.") && rest.ends_with(".boxd-tmp"));
            if staged && name != own {
                let _ = self.files.remove_file(&format!("{dir}/{name}"));
            }
        }
    }

    /// Whether the work's lock file still names this call.
    fn holds_lock(&mut self, work: &str) -> bool {
        let path = self.lock_path(work);
        self.holds(&path)
    }

    /// Whether the lock file `path` names this call.
    fn holds(&mut self, path: &str) -> bool {
        self.files.read(path).ok().flatten().is_some_and(|b| b.windows(self.owner.len()).any(|w| w == self.owner.as_bytes()))
    }

    /// The record written in two steps: a staged copy made durable (the slow part: its
    /// sync), then renamed over the record only while the lock is still this call's. A
    /// waiter that took a slow holder for a dead one and broke its lock may have written
    /// since; the holder then writes nothing and fails as a host killed before its write
    /// would (every caller already recovers from that), never over the other's change.
    fn write_unlocked(&mut self, w: &Work) -> ToolResult<()> {
        let dir = self.work_dir(&w.work);
        self.files.create_dir_all(&dir).map_err(|e| ledger_error("create the work's ledger folder", e))?;
        let mut bytes = serde_json::to_vec_pretty(w).expect("a ledger record always serialises");
        bytes.push(b'\n');
        let path = self.record_path(&w.work);
        if bytes.len() > RECORD_MAX {
            // Written, no call could read it again (record_bytes): the work would be lost
            // to every tool. What grows a record this far came from outside (a machine's
            // answer far past anything a work makes); the record stays as it was.
            return Err(ToolError::with_next(
                Code::LedgerFailed,
                format!("work '{}''s record would grow to {} MiB, past the {} MiB a record may hold, so this change was not written; the record stays as it was", w.work, bytes.len() >> 20, RECORD_MAX >> 20),
                format!("Call boxd_status: the work is as it was before this call. What grew it came from its machine's answer; boxd_sleep keeps the machine while you look (boxd_job for work '{}').", w.work),
            ));
        }
        let staged = format!("{path}.{}.next", self.owner.replace(':', "-"));
        self.files.write_atomic(&staged, &bytes).map_err(|e| ledger_error("write the ledger", e))?;
        if !self.holds_lock(&w.work) {
            let _ = self.files.remove_file(&staged);
            return Err(ToolError::new(
                Code::LedgerFailed,
                format!("another call took {}'s lock while this one wrote it (its write was slow), so this change was not written", path),
            ));
        }
        match self.files.rename(&staged, &path) {
            Ok(true) => Ok(()),
            Ok(false) => Err(ToolError::new(Code::LedgerFailed, format!("could not write the ledger: {staged} vanished before it was renamed"))),
            Err(e) => {
                let _ = self.files.remove_file(&staged);
                Err(ledger_error("write the ledger", e))
            }
        }
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

    /// The sha256 of a file in the work's ledger folder, hashed in pieces by the host (a
    /// bundle may be tens of MiB: never read whole into the component).
    pub fn blob_sha256(&mut self, work: &str, name: &str) -> ToolResult<Option<String>> {
        let path = format!("{}/{name}", self.work_dir(work));
        match self.files.sha256(&path) {
            // A symlink, folder or FIFO where the blob was is no stored copy of it.
            Err(FsError::Refused(_)) => Ok(None),
            r => r.map_err(|e| ledger_error("hash a file in the ledger", e)),
        }
    }

    /// The guest server's password: created once per work, kept in its own file.
    pub fn password(&mut self, work: &str) -> ToolResult<Option<String>> {
        Ok(self.get_blob(work, "password")?.map(|b| String::from_utf8_lossy(&b).trim().to_string()))
    }

    /// The password, made from `fresh` by whichever call comes first, so two ensures at
    /// once cannot give the guest two different passwords: read, and written whole when
    /// absent (or blank, an older plugin's crash mid-create), under the work's lock.
    pub fn password_or_create(&mut self, work: &str, fresh: &str) -> ToolResult<String> {
        let path = format!("{}/password", self.work_dir(work));
        self.lock(work)?;
        let stored = (|| {
            if let Some(p) = self.password(work)?.filter(|p| !p.is_empty()) {
                return Ok(p);
            }
            self.files.write_atomic(&path, fresh.as_bytes()).map_err(|e| ledger_error("store the server password", e))?;
            self.password(work)?.filter(|p| !p.is_empty()).ok_or_else(|| ToolError::new(Code::LedgerFailed, format!("{path} could not be created")))
        })();
        self.unlock(work);
        stored
    }
}

/// A record's bytes as a `Work`. A record this plugin wrote parses at once. One that does
/// not may be newer (it can hold words, a state, this plugin lacks): its reader is told to
/// update rather than that the record is broken. The same holds for a newer record that
/// happens to parse.
fn parse_record(path: &str, bytes: &[u8]) -> ToolResult<Work> {
    #[derive(Deserialize)]
    struct Versioned {
        schema: u32,
    }
    let parsed = serde_json::from_slice::<Work>(bytes);
    let schema = match &parsed {
        Ok(w) => Some(w.schema),
        Err(_) => serde_json::from_slice::<Versioned>(bytes).ok().map(|v| v.schema),
    };
    if let Some(newer) = schema.filter(|s| *s > SCHEMA) {
        return Err(ToolError::with_next(
            Code::LedgerFailed,
            format!("{path} has schema {newer} but this plugin reads up to {SCHEMA}"),
            "Update the plugin to the version that wrote this ledger.",
        ));
    }
    parsed.map_err(|e| {
        // Written whole or not at all (a temp file and a rename), so a record that does not
        // parse was damaged from outside: restarting or a writable folder changes nothing.
        let folder = paths::parent(path);
        let machine = paths::machine_name(folder.rsplit('/').next().unwrap_or_default());
        ToolError::with_next(
            Code::LedgerFailed,
            format!("{path} is not a ledger record ({e}); it was left as it is"),
            format!("Put {path} back from a backup if you have one. Else the plugin can no longer act on that work: look at {machine} yourself ('boxd machine get {machine}'), copy off what you need, remove it ('boxd machine remove {machine} -y') if it is yours, then move {folder} out of the ledger (its stored transcripts, bundle and patch stay in it)."),
        )
    })
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
mod tests;
