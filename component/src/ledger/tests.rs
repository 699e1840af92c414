//! The ledger's record format and its locked read-modify-write.

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

/// A record as ledgers written before the state became an enum hold it: it still
/// reads, and writes back byte for byte.
#[test]
fn an_existing_ledger_record_reads_and_writes_back_unchanged() {
    let old = r#"{
  "schema": 1,
  "work": "w1",
  "machine": "oc-w1",
  "machineId": "vm_1",
  "directory": "/p",
  "createdAt": "2026-01-01T00:00:00.000Z",
  "state": "dropping",
  "prompts": [
{
  "id": "p1",
  "at": "t",
  "sha256": "00",
  "bytes": 2,
  "admitted": true,
  "atMs": 5
}
  ],
  "filesIn": [],
  "filesOut": [],
  "proofs": [],
  "sleeps": [],
  "warnings": [],
  "git": null,
  "helperSha256": null,
  "asleepByTool": false,
  "owed": []
}
"#;
    let mut fs = MemFiles::new(&["/l"]);
    fs.put("/l/works/w1/work.json", old.as_bytes());
    let mut l = Ledger::new(&mut fs, "/l");
    let w = l.require("w1").unwrap();
    assert_eq!((w.state, w.prompts.len()), (WorkState::Dropping, 1));
    for (word, state) in [("creating", WorkState::Creating), ("open", WorkState::Open), ("closed", WorkState::Closed)] {
        let v: Work = serde_json::from_str(&old.replace("\"dropping\"", &format!("\"{word}\""))).unwrap();
        assert_eq!((v.state, v.state.as_str()), (state, word));
    }
    l.write(&w).unwrap();
    assert_eq!(fs.text("/l/works/w1/work.json").unwrap(), old);
}

#[test]
fn a_newer_record_asks_for_an_update_even_with_words_this_plugin_lacks() {
    let mut fs = MemFiles::new(&["/l"]);
    fs.put("/l/works/w1/work.json", br#"{"schema":2,"work":"w1","state":"paused-by-org"}"#);
    let e = Ledger::new(&mut fs, "/l").read("w1").unwrap_err();
    assert_eq!(e.code, Code::LedgerFailed);
    assert!(e.message.contains("schema 2") && e.next.contains("Update the plugin"), "{e:?}");
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
fn a_lost_prompt_moves_the_proof_counts_down_with_it() {
    let mut w = Work::new("w1", "/p", "t");
    for (id, admitted) in [("p1", false), ("p2", true), ("p3", true)] {
        w.prompts.push(Prompt { id: id.into(), admitted, ..Default::default() });
    }
    w.proofs.push(Proof { prompts: 2, ..Default::default() });
    let known: BTreeMap<String, bool> = [("p1".to_string(), false)].into_iter().collect();
    w.resolve_prompts(&known, "t", IN_FLIGHT_MS + 1);
    assert_eq!(w.prompts.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["p2", "p3"]);
    assert_eq!(w.proofs[0].prompts, 1, "the proof covered p1 and p2; it now covers p2 only");
    assert!(!w.proven(), "p3 is not proven");
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

/// The password goes into place whole or not at all: the first call's stands, a crash's
/// empty file (an older plugin's) is replaced, and no temp file is left either way.
#[test]
fn a_password_is_placed_whole_and_the_first_one_stands() {
    let mut fs = MemFiles::new(&["/l"]);
    let first = "a".repeat(32);
    assert_eq!(Ledger::new(&mut fs, "/l").password_or_create("w1", &first).unwrap(), first);
    assert_eq!(Ledger::new(&mut fs, "/l").password_or_create("w1", &"b".repeat(32)).unwrap(), first, "a second call takes the first's");
    fs.put("/l/works/w2/password", b"");
    assert_eq!(Ledger::new(&mut fs, "/l").password_or_create("w2", &"c".repeat(32)).unwrap(), "c".repeat(32), "a crash's empty file is replaced");
    assert!(fs.files.keys().all(|k| !k.contains("boxd-tmp")), "{:?}", fs.files.keys().collect::<Vec<_>>());
}
