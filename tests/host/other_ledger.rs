//! Another install of the plugin on the same boxd account (a second laptop, a teammate in
//! the same org) names its machines the same way: `oc-<work>`, from the same golden
//! snapshot, with the same idle bound. A create whose answer never came is taken up by its
//! name alone only once the guest shows no other ledger's server runs the work there.

use serde_json::Value;

use crate::common::*;

const W1: &str = r#"{"work":"w1"}"#;

/// Ledger B's create of w1 fails on the network (nothing made; B's record stays
/// `creating`). Ledger A then makes oc-w1 and runs a prompt there. B's next boxd_ensure used
/// to adopt A's machine (made like ours), upload, prepare it with B's password, and B could
/// then sleep it and harvest A's transcript. Now the guest refuses B's claim: B is told
/// NOT_OURS, forgets the id, and nothing of A's is touched (A's server, its password, its
/// run state); a later ensure of B asks boxd only for the name.
#[test]
fn a_machine_another_ledger_made_under_the_name_is_never_taken_up_by_it() {
    let world = World::new("other-ledger");
    let ledger_b = world.laptop.scratch.path("ledger-b");
    std::fs::create_dir_all(&ledger_b).unwrap();
    let b = |tool: &str, args: &str| world.call_with(&["--ledger", ledger_b.to_str().unwrap()], tool, args);
    world.faults(r#"[{"verb":"machine new","times":1,"action":"network"}]"#);
    let (code, first) = b("boxd_ensure", W1);
    assert_eq!(code, 1, "B's create never answered: {first:#}");
    world.faults("[]");
    world.ok_call("boxd_ensure", W1);
    world.ok_call("boxd_submit", r#"{"work":"w1","prompt":"A's own task"}"#);
    assert_eq!(world.job_until_idle("w1")["state"], "idle");
    let password = || world.on_machine("oc-w1", "cat \"$HOME/.boxd-helper/works/w1/password\"").stdout;
    let before = password();
    assert!(!before.is_empty(), "A's guest holds its password");

    let (code, v) = b("boxd_ensure", W1);
    assert_eq!((code, v["error"].as_str()), (1, Some("NOT_OURS")), "{v:#}");
    assert!(v["message"].as_str().unwrap().contains("another ledger") && v["next"].as_str().unwrap().contains("Leave oc-w1 alone"), "{v:#}");
    let record: Value = serde_json::from_slice(&std::fs::read(ledger_b.join("works/w1/work.json")).unwrap()).unwrap();
    assert_eq!(record["machineId"], Value::Null, "B forgot the id: {record:#}");
    assert_eq!(password(), before, "A's server password unchanged");
    world.forget_calls();
    let (code, v) = b("boxd_sleep", W1);
    assert_eq!(code, 1, "{v:#}");
    let (code, v) = b("boxd_ensure", W1);
    assert_eq!((code, v["error"].as_str()), (1, Some("NOT_OURS")), "{v:#}");
    let touched: Vec<Vec<String>> = world.laptop.boxd_calls().into_iter().filter(|c| c.first().is_some_and(|v| v == "machine") && c.get(1).is_some_and(|v| v != "get" && v != "list")).collect();
    assert!(touched.is_empty(), "B sent nothing to A's machine but reads: {touched:?}");
    // A's work goes on as before.
    assert_eq!(world.ok_call("boxd_job", W1)["state"], "idle");
    world.ok_call("boxd_submit", r#"{"work":"w1","prompt":"again"}"#);
    assert_eq!(world.job_until_idle("w1")["state"], "idle");
}
