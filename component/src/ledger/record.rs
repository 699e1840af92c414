//! The ledger's record of one work and what it holds: prompts, proofs, files, sleeps, the
//! git record, temps and the fork origin. Each keeps fields a newer host wrote (`unknown`).

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use super::{RunInterval, Settled, SCHEMA};
use crate::paths;

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
    pub state: WorkState,
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
    /// The git records of machines since rebuilt, oldest first: a rebuilt machine starts
    /// from a new work tree, so what a gone one's tree held at its last harvest is only in
    /// these bundles and patches, which no later harvest's record replaces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier_git: Vec<GitRecord>,
    /// sha256 of the guest helper uploaded for this work.
    #[serde(default)]
    pub helper_sha256: Option<String>,
    /// Its machine was taken up by its name alone (a create or fork whose answer never
    /// came): until a prepare proves no other ledger's server runs this work there (the
    /// guest's `claim`, before its first prepare), nothing of the work goes to it, and no
    /// tool but boxd_ensure and boxd_resume acts on it. Another install of the plugin on
    /// the same account makes its machines the same way, under the same name for the same
    /// work id.
    #[serde(default, skip_serializing_if = "core::ops::Not::not")]
    pub taken_by_name: bool,
    /// boxd_sleep put the machine down and nothing has seen it awake since: boxd_job
    /// then says `asleepBy: boxd_sleep` (else the idle bound or the CLI did).
    #[serde(default)]
    pub asleep_by_tool: bool,
    /// A boxd_sleep about to hibernate the machine: recorded before the hibernate, cleared
    /// by its answer or by a tool that sees the machine running since. The next boxd_sleep
    /// that finds the machine down takes it for this one's (a hibernate that landed though
    /// its answer was lost or said it failed), and a ledger that cannot be written refuses
    /// the sleep before the machine is touched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleeping: Option<Sleep>,
    /// Guest paths a harvest was asked for that have not come home yet: drop refuses
    /// while any is owed, unless the user discards it by name.
    #[serde(default)]
    pub owed: Vec<String>,
    /// Snapshots this work's boxd_image is saving (recorded before the save runs, cleared
    /// by its answer), so a save whose answer was lost is recognised by the next call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images_pending: Vec<String>,
    /// Snapshots this work's boxd_image made: asking again for one answers it as made
    /// (a lost answer's rerun), never a second save, while the work has had no prompt
    /// since (`images_at`); after one, the name is taken (SNAPSHOT_EXISTS).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<String>,
    /// How many prompts the work had when each of `images` was saved (absent in records
    /// older than it: such a save counts as a rerun, as it did then).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub images_at: BTreeMap<String, u64>,
    /// What a drop of a vanished machine could not recover (prompt ids after the proof).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unrecovered: Vec<String>,
    /// A rebuilt machine that does not hold the proven transcript yet: set with the
    /// rebuild's intent, cleared once the transcript is imported (by boxd_resume or the
    /// boxd_ensure that adopts it), so a rebuild cut short still gets it.
    #[serde(default, skip_serializing_if = "core::ops::Not::not")]
    pub restore_pending: bool,
    /// Proven sessions a drop began to put back in the laptop's OpenCode and has not read
    /// back whole yet: a copy of one found there is a restore cut short (the host killed
    /// mid-import), imported again, not a copy the user changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub laptop_restoring: Vec<String>,
    /// When the work was created (the creating call's clock); 0 in records older than
    /// the spend ledger, whose lifetime and asleep time are then unknown.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub created_ms: u64,
    /// When a drop marked it `dropping` (that call's clock): boxd_ensure and boxd_resume
    /// leave a drop this young to finish rather than reopen the work under it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropping_ms: u64,
    /// The golden snapshot its machine was made from: ensure with another is a conflict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Every interval its machine ran (`spend`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<RunInterval>,
    /// The cost and lifetime fixed when a drop closed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled: Option<Settled>,
    /// The work it was forked from, when boxd_fork made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<ForkOrigin>,
    /// The id boxd showed under this work's machine name that is not the one recorded: the
    /// work's own machine is gone and the name is someone else's now. Recorded by the tool
    /// that saw it, so boxd_status and admission (which see names only) stop counting it as
    /// this work's; cleared when a rebuild makes the work a machine again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_taken_by: Option<String>,
    /// Who the boxd CLI was signed in as when it made the machine (`user_id/active_org`
    /// of `boxd auth --json`; a fork takes its parent's). boxd answers for the account it is
    /// signed in to now, where another org's machine reads as gone: a work is closed or
    /// rebuilt as gone only while the CLI is signed in as this account. None: made before
    /// it was kept, or `auth` did not answer then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Laptop temp files a harvest is landing files into (recorded before the host
    /// creates them, cleared once they are renamed or removed): what a killed harvest left
    /// behind is exactly these, and the next harvest or drop removes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub temps: Vec<TempFile>,
    /// Fields this version does not know (a newer host wrote them): kept as they are, so
    /// an older host's read-modify-write never drops what a newer one recorded.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// A laptop temp file a harvest recorded before the host made it, and when; `dest` is
/// the file it lands as (absent in records written before it was kept); `sha256`, the
/// bytes that arrived in it, recorded before any is placed: a harvest killed after placing
/// some left them as this work's, not as a stranger's file. `guest`, the work-tree path it
/// comes from (absent in older records).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TempFile {
    pub path: String,
    pub at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Fields this version does not know (a newer host wrote them): kept as they are, so
    /// an older host's read-modify-write never drops what a newer one recorded.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Where a fork came from: its parent work, the parent's newest prompt it forked at, and
/// the parent's proven sessions it started with (their messages are the parent's, not new).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForkOrigin {
    pub parent: String,
    pub at_prompt: Option<String>,
    /// Session id → how many of its messages the parent had proven at the fork.
    #[serde(default)]
    pub inherited: BTreeMap<String, u64>,
    /// Its place in the fork's queue (forks over a cap wait, admitted in this order).
    #[serde(default)]
    pub order: u64,
    /// The parent record's `createdAt` when the fork was queued: a dropped parent's id
    /// ensured again is another work, whose machine its old forks never copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_created: Option<String>,
    /// Fields this version does not know (a newer host wrote them): kept as they are, so
    /// an older host's read-modify-write never drops what a newer one recorded.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// Where a work is in its life: creating → open → (dropping →) closed. Stored as the
/// lowercase word, as ledgers have always held it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkState {
    /// Its create was recorded and has not answered with an id yet.
    #[default]
    Creating,
    Open,
    /// A drop is under way: submits are refused, and the next drop finishes it.
    Dropping,
    /// Dropped; the id may be ensured again.
    Closed,
    /// A fork over a cap or ceiling: recorded, no machine yet; a later boxd_fork admits it.
    Queued,
}

impl WorkState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkState::Creating => "creating",
            WorkState::Open => "open",
            WorkState::Dropping => "dropping",
            WorkState::Closed => "closed",
            WorkState::Queued => "queued",
        }
    }
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
    /// When it was recorded (the recording call's clock): a prompt younger than
    /// `IN_FLIGHT_MS` may still be on its way, so the guest's "never saw it" is not final.
    #[serde(default)]
    pub at_ms: u64,
    /// The digest of the submit's file list (each target, laptop path and size, as checked
    /// before streaming); empty for a submit without files. With `sha256` it is the key a
    /// later submit is taken as this one's retry by.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub files_sha256: String,
    /// The submit call now carrying it (a tag of that call's random bytes): the call that
    /// recorded it, or the latest retry that took it over. A call that learns for certain
    /// that its exec delivered nothing takes the prompt off the record only while it still
    /// carries it, so never one another call may be delivering. Empty in older records.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub attempt: String,
    /// Fields this version does not know (a newer host wrote them): kept as they are, so
    /// an older host's read-modify-write never drops what a newer one recorded.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// Longer than any submit's exec may take (the helper's 120 s bound plus the host's 30 s
/// margin, with room to spare).
pub const IN_FLIGHT_MS: u64 = 10 * 60 * 1000;

/// Whether a wait of `wait_ms` from `at_ms` (a time a call recorded, by its clock) is over
/// at `now_ms`. A time more than CLOCK_STEP_MS ahead of now was recorded by a clock that
/// was that far ahead then (a dead CMOS battery, a VM resumed) and set right since: how
/// long ago it was cannot be told, so the wait counts as over, where it would otherwise
/// last as long as the clock was off (a submit's prompt or a drop's mark held a work for a
/// day). A smaller step back (NTP's, while a call is live) still waits it out.
pub fn waited(at_ms: u64, wait_ms: u64, now_ms: u64) -> bool {
    at_ms.saturating_add(wait_ms) <= now_ms || at_ms > now_ms.saturating_add(wait_ms.max(CLOCK_STEP_MS))
}

/// How far a recorded time may be ahead of the clock and still be waited on (`waited`).
pub const CLOCK_STEP_MS: u64 = 60 * 60 * 1000;

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
    /// A harvest found these bytes already at `laptop` and wrote nothing: the file is the
    /// user's, never one a later harvest may replace. Records without it were written.
    #[serde(default, skip_serializing_if = "core::ops::Not::not")]
    pub found: bool,
    /// Fields this version does not know: kept through every write (see Work::unknown).
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
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
    /// Fields this version does not know: kept through every write (see Work::unknown).
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Proof {
    pub at: String,
    /// How many prompts of the work this proof covers.
    pub prompts: u64,
    pub sessions: Vec<SessionProof>,
    /// The newest prompt the guest had admitted when it exported: drop refuses a machine
    /// whose newest prompt is another (one admitted after this proof).
    #[serde(default)]
    pub newest_prompt: Option<String>,
    /// Fields this version does not know (a newer host wrote them): kept as they are, so
    /// an older host's read-modify-write never drops what a newer one recorded.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sleep {
    pub by: String,
    pub at: String,
    /// Fields this version does not know: kept through every write (see Work::unknown).
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GitEntry {
    pub path: String,
    pub sha256: String,
    /// Fields this version does not know: kept through every write (see Work::unknown).
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
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
    /// sha256 of the patch's bytes: the live diff must still have it at drop.
    #[serde(default)]
    pub patch_sha256: Option<String>,
    /// How many prompts the record covers.
    pub prompts: u64,
    /// Every ref on the machine (HEAD, branches, tags) → commit, at the harvest.
    #[serde(default)]
    pub refs: BTreeMap<String, String>,
    /// The git bundle in the work's folder that holds every one of `refs`.
    #[serde(default)]
    pub bundle: Option<String>,
    /// Fields this version does not know (a newer host wrote them): kept as they are, so
    /// an older host's read-modify-write never drops what a newer one recorded.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

impl Work {
    pub fn new(work: &str, directory: &str, now: &str) -> Work {
        Work {
            schema: SCHEMA,
            work: work.to_string(),
            machine: paths::machine_name(work),
            directory: directory.to_string(),
            created_at: now.to_string(),
            state: WorkState::Creating,
            ..Default::default()
        }
    }

    /// The newest proof covers every prompt made so far.
    pub fn proven(&self) -> bool {
        self.proofs.last().is_some_and(|p| p.prompts >= self.prompts.len() as u64)
    }

    pub fn is_closed(&self) -> bool {
        self.state == WorkState::Closed
    }

    /// A drop of this work may still be under way: it marked the work `dropping` less than
    /// IN_FLIGHT_MS ago (`waited`). An older mark is a drop that was interrupted.
    pub fn drop_under_way(&self, now_ms: u64) -> bool {
        self.state == WorkState::Dropping && !waited(self.dropping_ms, IN_FLIGHT_MS, now_ms)
    }

    /// Record a harvest's proof. One that proves exactly what the newest proof proved (a
    /// harvest that found nothing new) only moves that proof's time: a record polled by
    /// harvests would otherwise grow by a copy each call, and every tool reads it whole.
    pub fn record_proof(&mut self, proof: Proof) {
        match self.proofs.last_mut() {
            Some(last) if Proof { at: last.at.clone(), ..proof.clone() } == *last => last.at = proof.at,
            _ => self.proofs.push(proof),
        }
    }

    /// Open with no machine id: its create was withdrawn (boxd refused it, or the name
    /// held a machine someone else made), and none has been made since. Every create
    /// records its intent as `creating` first, so no machine under the name is this
    /// ledger's: status shows it as not ours, the caps do not count it, a drop closes it.
    pub fn holds_no_machine(&self) -> bool {
        self.state == WorkState::Open && self.machine_id.is_none()
    }

    /// A machine under the work's name is not this work's: a tool saw another id there
    /// (`name_taken_by`), or its create was withdrawn (`holds_no_machine`). boxd_status and
    /// admission see names only, and count such a name for no work of this ledger.
    pub fn name_not_ours(&self) -> bool {
        self.name_taken_by.is_some() || self.holds_no_machine()
    }

    /// A call saw the machine running: it is not down by boxd_sleep, and a sleep's intent
    /// the call read before it looked (`sleeping_then`) did not put it down, so it is
    /// spent. One recorded since belongs to a sleep still under way, and stays.
    pub fn seen_running(&mut self, sleeping_then: &Option<Sleep>) {
        self.asleep_by_tool = false;
        if self.sleeping == *sleeping_then {
            self.sleeping = None;
        }
    }

    /// Prompts the guest may or may not have: recorded before their exec, not yet answered.
    pub fn unresolved(&self) -> Vec<String> {
        self.prompts.iter().filter(|p| !p.admitted).map(|p| p.id.clone()).collect()
    }

    /// Take `ids` off the prompt list. Proof and git counts are positions in this list:
    /// they move down with it, so a newer prompt never slips under an older proof.
    pub fn remove_prompts(&mut self, ids: &[String]) {
        let removed_before = |n: u64| self.prompts.iter().take(n as usize).filter(|p| ids.contains(&p.id)).count() as u64;
        let shifts: Vec<u64> = self.proofs.iter().map(|p| removed_before(p.prompts)).collect();
        let git = self.git.as_ref().map(|g| removed_before(g.prompts));
        for (p, d) in self.proofs.iter_mut().zip(shifts) {
            p.prompts -= d;
        }
        if let (Some(g), Some(d)) = (self.git.as_mut(), git) {
            g.prompts -= d;
        }
        self.prompts.retain(|p| !ids.contains(&p.id));
    }

    /// Apply the guest's word on unresolved prompts: a prompt it knows was admitted; one it
    /// never saw was never delivered (the host stopped before sending it) and leaves the
    /// record, with a warning, so it does not block the proof for ever.
    pub fn resolve_prompts(&mut self, known: &BTreeMap<String, bool>, now: &str, now_ms: u64) {
        let mut lost = Vec::new();
        for p in self.prompts.iter_mut().filter(|p| !p.admitted) {
            match known.get(&p.id) {
                Some(true) => p.admitted = true,
                // Another call's exec may still be carrying it: only an old prompt is lost.
                Some(false) if waited(p.at_ms, IN_FLIGHT_MS, now_ms) => lost.push(p.id.clone()),
                _ => {}
            }
        }
        if !lost.is_empty() {
            self.remove_prompts(&lost);
            self.warnings.push(format!("{now}: prompt(s) {} never reached the machine (the host stopped before sending); submit again if still wanted", lost.join(", ")));
        }
    }
}
