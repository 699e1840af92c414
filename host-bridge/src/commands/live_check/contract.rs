//! The contract: every boxd CLI behaviour the plugin relies on, as one table (docs/live-check.md
//! prints it, and a test keeps the two equal). `$M` is the throwaway machine, `$S` its
//! snapshot, `$V` the env var; live-check picks fresh names for each run.

pub struct Row {
    pub id: u8,
    pub behaviour: &'static str,
    pub check: &'static str,
    pub expected: &'static str,
}

pub const SIGN_OUT_ROW: u8 = 16;

pub const ROWS: &[Row] = &[
    Row {
        id: 1,
        behaviour: "the listing answers when signed in",
        check: "`boxd machine list --json`",
        expected: "a JSON array of `{name,status,url,source,sharing}` (strings) that holds `$M`",
    },
    Row {
        id: 2,
        behaviour: "JSON comes after optional noise",
        check: "every `--json` answer above and below",
        expected: "the first line that starts with `{`/`[` starts the JSON document",
    },
    Row {
        id: 3,
        behaviour: "create from a snapshot with an idle bound",
        check: "`boxd machine new $M --from-snapshot opencode-golden --auto-hibernate-timeout 1800 --json`",
        expected: "`{name,id,url,source,boot}`; `boot` may be `\"timeout\"` (then `get` shows it running soon)",
    },
    Row {
        id: 4,
        behaviour: "`get` shows id, status, sharing, isolated as strings",
        check: "`boxd machine get $M --json`",
        expected: "`\"id\":\"…\"`, `\"status\":\"running\"`, `\"sharing\":\"private\"`, `\"isolated\":\"no\"`, `\"auto_hibernate\":\"1800s\"`",
    },
    Row {
        id: 5,
        behaviour: "a missing machine",
        check: "`boxd machine get $M --json` before `$M` exists",
        expected: "exit 1, `error: VM '$M' not found`",
    },
    Row {
        id: 6,
        behaviour: "exec joins arguments into one `sh -c` line, passes stdin and the exit code, keeps stderr apart",
        check: "`printf 'a b' | boxd machine exec $M --timeout 60 -- sh -c \"'cat; echo err >&2; exit 42'\"`",
        expected: "stdout `a b`, stderr `err`, exit 42",
    },
    Row {
        id: 7,
        behaviour: "`--timeout`",
        check: "`boxd machine exec $M --timeout 2 -- sleep 10`",
        expected: "exit 124",
    },
    Row {
        id: 8,
        behaviour: "a background process survives its exec",
        check: "`boxd machine exec $M -- sh -c \"'setsid sleep 600 >/dev/null 2>&1 </dev/null & echo $!'\"`, then in a second exec `cat /proc/PID/comm`",
        expected: "a pid; then `sleep`",
    },
    Row {
        id: 9,
        behaviour: "hibernate and wake; the process survives",
        check: "`boxd machine hibernate $M --json`, `boxd machine list --json`, `boxd machine wake $M --json`, `cat /proc/PID/comm` again",
        expected: "status `hibernated`; after the wake the same pid is `sleep`",
    },
    Row {
        id: 10,
        behaviour: "idle bound set after waking",
        check: "`boxd machine config set $M auto-hibernate.timeout 1900`, then `get`",
        expected: "`\"auto_hibernate\":\"1900s\"`",
    },
    Row {
        id: 11,
        behaviour: "snapshot save blocks and versions",
        check: "`boxd snapshots save $M $S`, `boxd snapshots list --json`",
        expected: "exit 0, then `{name:\"$S\",version:\"v1\",status:\"ready\"}`",
    },
    Row {
        id: 12,
        behaviour: "remove",
        check: "`boxd machine remove $M -y --json`, then `get`",
        expected: "exit 0; then check 5's error",
    },
    Row {
        id: 13,
        behaviour: "env reaches every exec; secrets are sealed",
        check: "`boxd env set $V VALUE --secret`, `boxd env list --json`, then an exec that prints `$V`",
        expected: "the listing shows `(sealed)`; the exec prints VALUE",
    },
    Row {
        id: 14,
        behaviour: "the exec cwd is the machine's home, and it is writable",
        check: "`boxd machine exec $M -- sh -c \"'pwd; echo $HOME; test -w . && echo writable'\"`",
        expected: "`pwd` = `$HOME` (`/home/boxd` on boxd), then `writable`",
    },
    Row {
        id: 15,
        behaviour: "python3, git, curl, tar, sha256sum on the image",
        check: "`boxd machine exec $M -- sh -c \"'for c in python3 git curl tar sha256sum; do command -v $c >/dev/null || echo missing: $c; done'\"`",
        expected: "all present (the guest helper and the golden build need them)",
    },
    Row {
        id: SIGN_OUT_ROW,
        behaviour: "signed out, the listing fails",
        check: "`boxd auth logout`, `boxd machine list --json`, `boxd auth login` (only with `--sign-out`)",
        expected: "exit 1 with an `error:` line containing \"not logged in\" (or \"unauthenticated\")",
    },
];

pub fn row(id: u8) -> &'static Row {
    ROWS.iter().find(|r| r.id == id).expect("a row of the contract")
}

/// The contract as docs/live-check.md's table.
pub fn markdown() -> String {
    let mut t = String::from("| # | behaviour relied on | check | expected |\n|---|---|---|---|\n");
    for r in ROWS {
        t.push_str(&format!("| {} | {} | {} | {} |\n", r.id, r.behaviour, r.check.replace('|', "\\|"), r.expected));
    }
    t
}
