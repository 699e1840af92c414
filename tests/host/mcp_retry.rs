//! A client that cancels a change call (most often its own timeout) and asks the same again
//! (commands/mcp_kept.rs): the first try runs to its end, and the retry gets its answer
//! instead of running the change a second time. Raw JSON-RPC on stdio, as a client's own
//! `notifications/cancelled` reaches the server.

use std::time::Duration;

use serde_json::{json, Value};

use crate::audit_log::Mcp;
use crate::common::*;

fn record(world: &World) -> Value {
    serde_json::from_slice(&std::fs::read(world.laptop.ledger.join("works/w1/work.json")).unwrap()).unwrap()
}

#[test]
fn a_submit_cancelled_mid_call_and_asked_again_sends_the_prompt_once() {
    let world = World::new("mcp-retry");
    world.ok_call("boxd_ensure", r#"{"work":"w1"}"#);
    let oc = opencode_bin();
    let mut mcp = Mcp::start(&world.laptop, &["--opencode", oc.to_str().unwrap()]);
    // The submit's exec waits 3 s before it runs: the client gives up first.
    world.faults(r#"[{"verb":"machine exec","times":1,"action":"delay","ms":3000}]"#);
    let args = json!({ "work": "w1", "prompt": "say hello once" });
    mcp.call(10, "boxd_submit", args.clone());
    std::thread::sleep(Duration::from_millis(800));
    mcp.send(json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": 10, "reason": "timed out" } }));
    // The first try runs on, and its prompt's run ends, before the client asks again (a read
    // in between keeps the cancelled call's answer): a plain rerun would run it a second time.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut id = 100;
    let job = loop {
        id += 1;
        mcp.call(id, "boxd_job", json!({ "work": "w1" }));
        let v = mcp.responses(&[id]).remove(&id).unwrap()["result"]["structuredContent"].clone();
        if v["state"] == "idle" && v["pending"] == 0 && v["outcome"] == "completed" {
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "the first try's run never ended: {v:#}");
        std::thread::sleep(Duration::from_millis(300));
    };
    mcp.call(11, "boxd_submit", args.clone());
    let retry = mcp.responses(&[11]).remove(&11).unwrap();
    let answer = &retry["result"]["structuredContent"];
    assert_eq!(retry["result"]["isError"], false, "{retry:#}");
    assert!(answer["answeredBefore"].is_string(), "the first try's answer: {answer:#}");
    let prompts = record(&world)["prompts"].clone();
    assert_eq!(prompts.as_array().map(Vec::len), Some(1), "one prompt recorded: {prompts:#}");
    assert_eq!(answer["promptId"], prompts[0]["id"], "{answer:#}");
    let submits = || world.laptop.boxd_calls().iter().filter(|c| c.len() > 2 && c[..2] == ["machine", "exec"] && c.iter().any(|a| a.contains(" submit --work"))).count();
    assert_eq!(submits(), 1, "the prompt went to the machine once: {:?}", world.laptop.boxd_calls());
    assert_eq!(job["promptId"], prompts[0]["id"], "{job:#}");
    let runs = world.laptop.boxd(&["machine", "exec", "oc-w1", "--", "sh", "-c", "'wc -l < ~/.boxd-helper/works/w1/runs.jsonl'"]);
    assert_eq!(String::from_utf8_lossy(&runs.stdout).trim(), "1", "it ran once");
    // A further identical call is not a retry of a cancelled one: the words run again.
    mcp.call(13, "boxd_submit", args);
    let again = mcp.responses(&[13]).remove(&13).unwrap();
    assert!(again["result"]["structuredContent"].get("answeredBefore").is_none(), "{again:#}");
    assert_eq!(submits(), 2);
    mcp.close();
}
