//! Every request line to `boxd-host mcp` gets an answer (commands/mcp_lines.rs), with raw
//! JSON-RPC on stdio: lines rmcp would drop in silence (not UTF-8, a lone surrogate, not
//! JSON, `params` or `_meta` not objects, over 16 MiB) are JSON-RPC errors under their id;
//! `arguments` that are not an object and a `name` that is not a string reach the
//! component (ARGS_INVALID, TOOL_UNKNOWN as tool results, as from `boxd-host call`); a
//! second call under an id still in flight is -32600, after the first's own answer; and
//! the server goes on answering.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::audit_log::Mcp;
use crate::common::*;

/// Every message until each of `ids` has had `per_id` answers.
fn answers(mcp: &Mcp, ids: &[u64], per_id: usize) -> Vec<Value> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let count = |got: &Vec<Value>, id: u64| got.iter().filter(|v: &&Value| v["id"] == id).count();
    while !ids.iter().all(|&i| count(&got, i) >= per_id) {
        let left = deadline.saturating_duration_since(Instant::now());
        let v = mcp.lines.recv_timeout(left).unwrap_or_else(|_| panic!("no answer to every one of {ids:?}: {got:#?}"));
        got.push(v);
    }
    got
}

fn one(got: &[Value], id: u64) -> &Value {
    got.iter().find(|v| v["id"] == id).unwrap()
}

#[test]
fn every_request_line_is_answered() {
    let laptop = Laptop::new("mcp-lines");
    let mut mcp = Mcp::start(&laptop, &[]);
    let lines: [&[u8]; 9] = [
        br#"{"jsonrpc":"2.0","id":31,"method":"tools/call","params":{"name":"boxd_job","arguments":{"work":"\ud800"}}}"#,
        b"{\"jsonrpc\":\"2.0\",\"id\":32,\"method\":\"tools/call\",\"params\":{\"name\":\"boxd_job\",\"arguments\":{\"work\":\"w\xff1\"}}}",
        br#"{"jsonrpc":"2.0","id":33,"method":"tools/call","params":{"name":"boxd_job","arguments":{"work":"w1"},"_meta":"x"}}"#,
        br#"{"jsonrpc":"2.0","id":34,"method":"tools/call","params":"x"}"#,
        br#"{"jsonrpc":"2.0","id":35,"method":"tools/call","params":{"name":"boxd_job""#,
        br#"{"jsonrpc":"2.0","id":36,"method":"tools/call","params":{"name":"boxd_job","arguments":[1]}}"#,
        br#"{"jsonrpc":"2.0","id":37,"method":"tools/call","params":{"name":"boxd_job","arguments":"w1"}}"#,
        br#"{"jsonrpc":"2.0","id":38,"method":"tools/call","params":{"arguments":{}}}"#,
        br#"{"jsonrpc":"2.0","id":39,"method":"tools/call","params":{"name":5}}"#,
    ];
    for line in lines {
        mcp.raw(line);
    }
    let got = answers(&mcp, &(31..40).collect::<Vec<_>>(), 1);
    for (id, code) in [(31, -32602), (32, -32700), (33, -32602), (34, -32602), (35, -32700)] {
        assert_eq!(one(&got, id)["error"]["code"], code, "{id}: {:#}", one(&got, id));
    }
    for (id, error) in [(36, "ARGS_INVALID"), (37, "ARGS_INVALID"), (38, "TOOL_UNKNOWN"), (39, "TOOL_UNKNOWN")] {
        let r = &one(&got, id)["result"];
        assert_eq!((r["isError"].clone(), r["structuredContent"]["error"].clone()), (json!(true), json!(error)), "{id}: {:#}", one(&got, id));
    }
    assert!(one(&got, 36)["result"]["structuredContent"]["message"].as_str().unwrap().contains("must be a JSON object"));

    // Over 16 MiB: a tools/call is FILE_TOO_LARGE, and the server reads on.
    let mut big = br#"{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"boxd_submit","arguments":{"work":"w1","prompt":""#.to_vec();
    big.extend(std::iter::repeat_n(b'A', 17 << 20));
    big.extend(br#""}}}"#);
    mcp.raw(&big);
    let got = answers(&mcp, &[41], 1);
    assert_eq!(one(&got, 41)["result"]["structuredContent"]["error"], "FILE_TOO_LARGE", "{:#}", one(&got, 41));

    // A second call under an id still in flight is refused; the first is answered.
    std::fs::write(laptop.boxd_home.join("faults.json"), r#"[{"verb":"*","times":1,"action":"delay","ms":1500}]"#).unwrap();
    mcp.call(42, "boxd_status", json!({}));
    std::thread::sleep(Duration::from_millis(300));
    mcp.call(42, "boxd_job", json!({ "work": "w1" }));
    let got = answers(&mcp, &[42], 2);
    // The refusal comes once the first is answered (rmcp keeps one entry an id).
    let codes: Vec<Value> = got.iter().filter(|v| v["id"] == 42).map(|v| v["error"]["code"].clone()).collect();
    assert_eq!(codes, [Value::Null, json!(-32600)], "{got:#?}");
    assert!(got.iter().any(|v| v["id"] == 42 && v["result"]["structuredContent"]["host"]["name"] == "boxd-host-mcp"), "{got:#?}");
    // Answered, the id is free again.
    let again = mcp.request(42, "tools/call", json!({ "name": "boxd_job", "arguments": { "work": "w1" } }));
    assert!(again["result"].is_object(), "{again:#}");
    mcp.close();
}
