//! What boxd_status reads of a record: the fields it shows, with the rest skipped unread
//! (serde's `IgnoredAny` allocates nothing). A grown record is mostly prompts' digests,
//! proofs' sessions, the git record and sleeps, none of which status shows; parsing them
//! was most of status's time per work.
//!
//! The summary is read from the record itself on every call (no index to go stale). Any
//! record it cannot read (torn, newer, a field status shows of the wrong type, a required
//! field missing) is read again in full, so its error is word for word the full read's.
//! One difference is deliberate: a damaged field status never reads (a session's digest,
//! the git record, a null `createdAt`) is reported by the tools that read it, not by
//! status.

use alloc::string::String;
use alloc::vec::Vec;
use serde::de::IgnoredAny;
use serde::Deserialize;

use super::{ForkOrigin, Proof, Prompt, RunInterval, Settled, TempFile, Work, WorkState};

/// The record as status reads it. Required fields of `Work` that status does not show
/// are still required (as `IgnoredAny`), so a record missing one goes to the full read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Summary {
    pub schema: u32,
    work: String,
    machine: String,
    #[serde(default)]
    machine_id: Option<String>,
    directory: String,
    #[serde(rename = "createdAt")]
    _created_at: IgnoredAny,
    state: WorkState,
    #[serde(default)]
    prompts: Vec<PromptSummary>,
    #[serde(default)]
    proofs: Vec<ProofSummary>,
    #[serde(default)]
    warnings: Vec<String>,
    #[serde(default)]
    owed: Vec<String>,
    #[serde(default)]
    created_ms: u64,
    #[serde(default)]
    runs: Vec<RunInterval>,
    #[serde(default)]
    settled: Option<Settled>,
    #[serde(default)]
    fork: Option<ForkOrigin>,
    #[serde(default)]
    temps: Vec<TempFile>,
    #[serde(default)]
    name_taken_by: Option<String>,
}

/// A prompt's time (the spend's idle bound counts from it); the rest is skipped.
#[derive(Deserialize)]
struct PromptSummary {
    #[serde(rename = "id")]
    _id: IgnoredAny,
    #[serde(rename = "at")]
    _at: IgnoredAny,
    #[serde(rename = "sha256")]
    _sha256: IgnoredAny,
    #[serde(rename = "bytes")]
    _bytes: IgnoredAny,
    #[serde(default, rename = "atMs")]
    at_ms: u64,
}

/// How many prompts a proof covers; its sessions are skipped.
#[derive(Deserialize)]
struct ProofSummary {
    #[serde(rename = "at")]
    _at: IgnoredAny,
    prompts: u64,
    #[serde(rename = "sessions")]
    _sessions: IgnoredAny,
}

impl Summary {
    /// A `Work` holding only what status reads: every field it does not read is empty.
    /// Never written back (status writes nothing).
    pub fn into_work(self) -> Work {
        Work {
            schema: self.schema,
            work: self.work,
            machine: self.machine,
            machine_id: self.machine_id,
            directory: self.directory,
            state: self.state,
            prompts: self.prompts.into_iter().map(|p| Prompt { at_ms: p.at_ms, ..Default::default() }).collect(),
            proofs: self.proofs.into_iter().map(|p| Proof { prompts: p.prompts, ..Default::default() }).collect(),
            warnings: self.warnings,
            owed: self.owed,
            created_ms: self.created_ms,
            runs: self.runs,
            settled: self.settled,
            fork: self.fork,
            temps: self.temps,
            name_taken_by: self.name_taken_by,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use alloc::format;
    use alloc::string::ToString;
    use alloc::vec;

    use super::super::*;
    use crate::testing::MemFiles;

    const H: u64 = 3_600_000;

    /// Works that fill every field status reads, and those it skips.
    fn grown_works() -> Vec<Work> {
        let mut out = Vec::new();
        for variant in 0..6u64 {
            let mut w = Work::new("w1", "/p", "2026-01-01T00:00:00.000Z");
            w.state = [WorkState::Open, WorkState::Creating, WorkState::Dropping, WorkState::Queued, WorkState::Closed, WorkState::Open][variant as usize];
            // The last: open with no machine id (a withdrawn create).
            w.machine_id = (variant != 5).then(|| "m-1".into());
            w.created_ms = variant * H;
            for i in 0..variant * 3 {
                w.prompts.push(Prompt { id: format!("p{i}"), at: "t".into(), sha256: "0".repeat(64), bytes: 9, admitted: i % 2 == 0, at_ms: (variant + i) * H, ..Default::default() });
            }
            for i in 0..variant {
                let session = SessionProof { id: "ses_1".into(), parent_id: None, messages: i, digest: "d".repeat(64), file: Some("export-1.json".into()), ..Default::default() };
                w.proofs.push(Proof { at: "t".into(), prompts: i * 2, sessions: vec![session], newest_prompt: Some(format!("p{i}")), ..Default::default() });
            }
            for i in 0..variant * 50 {
                w.open_run(variant * H + i * 1000);
                w.close_run(variant * H + i * 1000 + 500, "boxd_sleep");
                w.sleeps.push(Sleep { by: "boxd_sleep".into(), at: "t".into(), ..Default::default() });
            }
            if variant % 2 == 1 {
                w.open_run(variant * 2 * H); // still running
            }
            w.warnings = (0..variant).map(|i| format!("warning {i}")).collect();
            w.owed = (0..variant % 3).map(|i| format!("out/{i}.txt")).collect();
            w.temps = (0..variant % 2).map(|i| TempFile { path: format!("/p/.t{i}"), at_ms: i, ..TempFile::default() }).collect();
            w.fork = (variant == 3).then(|| ForkOrigin { parent: "w0".into(), at_prompt: Some("p1".into()), inherited: [("ses_1".to_string(), 4)].into_iter().collect(), order: 2, parent_created: None, ..Default::default() });
            w.settled = (variant == 4).then_some(Settled { closed_ms: 9 * H, lifetime_ms: 5 * H, running_ms: H, cost_micros: 123_456, ..Default::default() });
            w.git = Some(GitRecord { head: "abc".into(), prompts: variant, ..Default::default() });
            w.files_in.push(FileRecord { guest: "a".into(), laptop: "/p/a".into(), size: 1, sha256: "0".repeat(64), at: "t".into(), ..Default::default() });
            out.push(w);
        }
        out
    }

    /// Everything boxd_status reads of a work, as it reads it.
    fn as_status_sees(w: &Work, now: u64) -> impl PartialEq + core::fmt::Debug {
        let p = Prices::default();
        let mut seen = w.clone();
        seen.seen_not_running(now, H / 2, true);
        let shown = |w: &Work| {
            let words = (w.work.clone(), w.machine.clone(), w.directory.clone(), w.state, w.is_closed(), w.holds_no_machine(), w.proven(), w.prompts.len());
            let lists = (w.warnings.clone(), w.owed.clone(), w.temps.clone(), w.fork.clone());
            let money = (w.spend_micros(&p, now), w.burn_micros(&p), w.running_ms(now), w.lifetime_ms(now), w.running_since());
            (words, lists, money)
        };
        (shown(w), shown(&seen))
    }

    fn ledger_with(bytes: &[u8]) -> MemFiles {
        let mut fs = MemFiles::new(&["/l"]);
        fs.put("/l/works/w1/work.json", bytes);
        fs
    }

    #[test]
    fn the_summary_shows_what_the_full_record_shows() {
        for w in grown_works() {
            let mut fs = MemFiles::new(&["/l"]);
            Ledger::new(&mut fs, "/l").write(&w).unwrap();
            let mut l = Ledger::new(&mut fs, "/l");
            let (full, summary) = (l.read("w1").unwrap().unwrap(), l.summary("w1").unwrap().unwrap());
            assert_eq!(full, w);
            for now in [0, 7 * H, 40 * H] {
                assert_eq!(as_status_sees(&summary, now), as_status_sees(&full, now), "{w:?}");
            }
        }
    }

    /// A record before the spend ledger (no runs, no createdMs, no temps) reads the same.
    #[test]
    fn an_old_record_reads_as_before() {
        let old = br#"{"schema":1,"work":"w1","machine":"oc-w1","machineId":"vm_1","directory":"/p","createdAt":"t","state":"open",
            "prompts":[{"id":"p1","at":"t","sha256":"00","bytes":2}],"filesIn":[],"filesOut":[],"proofs":[{"at":"t","prompts":1,"sessions":[]}],
            "sleeps":[],"warnings":["w"],"git":null,"helperSha256":null,"asleepByTool":false,"owed":[]}"#;
        let mut fs = ledger_with(old);
        let mut l = Ledger::new(&mut fs, "/l");
        let (full, summary) = (l.read("w1").unwrap().unwrap(), l.summary("w1").unwrap().unwrap());
        assert!(summary.proven() && summary.runs.is_empty());
        assert_eq!(as_status_sees(&summary, 5 * H), as_status_sees(&full, 5 * H));
    }

    /// What the summary cannot take is read in full: the same error, word for word.
    #[test]
    fn a_record_the_summary_cannot_take_gives_the_full_reads_error() {
        let good = serde_json::to_value(&grown_works()[3]).unwrap();
        let mut damaged = vec![b"{\"schema\":1,\"wor".to_vec(), br#"{"schema":2,"work":"w1","state":"paused-by-org"}"#.to_vec()];
        for (field, value) in [("state", "\"paused\""), ("runs", "[{\"fromMs\":\"x\"}]"), ("prompts", "[{\"id\":\"p1\"}]"), ("proofs", "[{\"prompts\":-1}]"), ("warnings", "7")] {
            let mut v = good.clone();
            v[field] = serde_json::from_str(value).unwrap();
            damaged.push(v.to_string().into_bytes());
        }
        let mut missing = good.clone();
        missing.as_object_mut().unwrap().remove("createdAt");
        damaged.push(missing.to_string().into_bytes());
        for bytes in damaged {
            let mut fs = ledger_with(&bytes);
            let mut l = Ledger::new(&mut fs, "/l");
            let full = l.read("w1").unwrap_err();
            let summary = l.summary("w1").expect_err(&String::from_utf8_lossy(&bytes));
            assert_eq!((summary.code, &summary.message, &summary.next), (full.code, &full.message, &full.next));
        }
    }

    /// Every field of a grown record, at every depth, replaced by each of a few wrong
    /// values: a record the full read takes, the summary takes and shows the same; a record
    /// the summary refuses gets the full read's error, word for word.
    #[test]
    fn any_damaged_field_reads_the_same_or_fails_the_same() {
        fn paths(v: &serde_json::Value, at: &str, out: &mut Vec<String>) {
            let children: Vec<(String, &serde_json::Value)> = match v {
                serde_json::Value::Object(m) => m.iter().map(|(k, c)| (format!("{at}/{k}"), c)).collect(),
                serde_json::Value::Array(a) => a.iter().take(2).enumerate().map(|(i, c)| (format!("{at}/{i}"), c)).collect(),
                _ => return,
            };
            for (path, child) in children {
                out.push(path.clone());
                paths(child, &path, out);
            }
        }
        let wrong: Vec<serde_json::Value> = ["null", "-1", "1.5", "\"x\"", "[]", "{}", "[{}]", "true", "18446744073709551616"].iter().map(|v| serde_json::from_str(v).unwrap()).collect();
        let (mut cases, mut refused) = (0, 0);
        for mut w in grown_works() {
            // Two of each list are damaged: the rest only make each case slower.
            w.runs.drain(..w.runs.len().saturating_sub(2));
            w.sleeps.truncate(2);
            let good = serde_json::to_value(&w).unwrap();
            let mut all = Vec::new();
            paths(&good, "", &mut all);
            for (path, value) in all.iter().flat_map(|p| wrong.iter().map(move |v| (p, v))) {
                let mut damaged = good.clone();
                *damaged.pointer_mut(path).unwrap() = value.clone();
                let mut fs = ledger_with(damaged.to_string().as_bytes());
                let mut l = Ledger::new(&mut fs, "/l");
                match (l.read("w1"), l.summary("w1")) {
                    (Ok(Some(full)), Ok(Some(summary))) => assert_eq!(as_status_sees(&summary, 40 * H), as_status_sees(&full, 40 * H), "{path} = {value}"),
                    (Err(full), Err(summary)) => {
                        assert_eq!((summary.code, &summary.message, &summary.next), (full.code, &full.message, &full.next), "{path} = {value}");
                        refused += 1;
                    }
                    (Err(_), Ok(_)) => {} // a field status never reads: left to the tools that read it
                    (full, summary) => panic!("{path} = {value}: the full read gave {full:?}, the summary {summary:?}"),
                }
                cases += 1;
            }
        }
        assert!(cases > 1000 && refused > 100, "{cases} cases, {refused} refused");
    }

    /// The one deliberate difference: a damaged field status never reads is left to the
    /// tools that read it (and the summary still writes nothing).
    #[test]
    fn a_damaged_field_status_does_not_read_is_left_to_the_tools_that_read_it() {
        for (field, value) in [("git", serde_json::json!({ "head": 7 })), ("createdAt", serde_json::Value::Null)] {
            let mut v = serde_json::to_value(&grown_works()[2]).unwrap();
            v[field] = value;
            let bytes = v.to_string().into_bytes();
            let mut fs = ledger_with(&bytes);
            let mut l = Ledger::new(&mut fs, "/l");
            assert_eq!(l.read("w1").unwrap_err().code, crate::errors::Code::LedgerFailed);
            assert_eq!(l.summary("w1").unwrap().unwrap().work, "w1");
            assert_eq!(fs.text("/l/works/w1/work.json").unwrap().as_bytes(), bytes.as_slice());
        }
    }
}
