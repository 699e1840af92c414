// The bridge's parts without OpenCode: the grants and the child runner (the same policy as
// host-bridge/src/policy.rs and spawn/), the worker pool with the real component and
// boxd-local, the shim write workaround, the permission rules and the skill check.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { BOXD_LOCAL, PLUGIN, REPO, missingPrerequisite, probeWrite } from "./harness.mjs";

const built = fs.existsSync(path.join(PLUGIN, "dist/worker.js"));
const skipNoBuild = built ? false : "host-bridge/opencode/dist is missing: run npm run build there";
// lib/policy.js reads dist/policy.json at import: load the modules only once it exists.
const lib = built
  ? {
      policy: await import(path.join(PLUGIN, "lib/policy.js")),
      pool: await import(path.join(PLUGIN, "lib/pool.js")),
    }
  : {};
const { addDefaultRules, baseAction, insertAfterBase, prependRules, wildcardMatch, defaultRules } = await import(path.join(PLUGIN, "lib/rules.js"));
const { checkSkill } = await import(path.join(PLUGIN, "lib/skill.js"));

const cleanup = [];
after(() => {
  for (const f of cleanup.reverse()) f();
});

function scratch(name) {
  const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), `boxd-bridge-${name}-`)));
  cleanup.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

const TOOLS = [
  { name: "boxd_status", access: "read" },
  { name: "boxd_ensure", access: "change" },
  { name: "boxd_drop", access: "change" },
];

describe("permission rules", () => {
  test("a base rule is permission * for pattern *, in either form", () => {
    assert.equal(baseAction("allow"), "allow");
    assert.equal(baseAction({ "*": "ask", bash: "deny" }), "ask");
    assert.equal(baseAction({ "*": { "*": "allow", "x-*": "deny" } }), "allow");
    assert.equal(baseAction({ "*": { "safe-*": "allow" } }), undefined);
    assert.equal(baseAction({ bash: "allow" }), undefined);
    assert.equal(baseAction(undefined), undefined);
  });

  test("rules go right after the base allow; a rule the user wrote after it keeps winning", () => {
    const rules = defaultRules(TOOLS, "all");
    const out = insertAfterBase({ boxd_status: "deny", "*": "allow", boxd_drop: "deny", bash: "ask" }, rules);
    assert.deepEqual(Object.keys(out), ["*", "boxd_*", "boxd_status", "boxd_ensure", "boxd_drop", "bash"]);
    assert.equal(out.boxd_drop, "deny", "the user's later rule keeps its value");
    assert.equal(out.boxd_status, "allow", "a rule before the base was dead already");
    assert.deepEqual(insertAfterBase("allow", rules), { "*": "allow", ...rules });
  });

  test("under ask-changes the change tools are ask, so a base allow cannot answer ctx.ask", () => {
    assert.deepEqual(defaultRules(TOOLS, "ask-changes"), { "boxd_*": "allow", boxd_status: "allow", boxd_ensure: "ask", boxd_drop: "ask" });
  });

  test("on OpenCode's default base the per-tool rules go first, minus what the global permission names", () => {
    const out = prependRules({ bash: "ask", boxd_status: "deny" }, defaultRules(TOOLS, "all"), { "boxd_e*": "deny" });
    assert.deepEqual(out, { boxd_drop: "allow", bash: "ask", boxd_status: "deny" });
    assert.ok(wildcardMatch("boxd_*", "boxd_drop") && !wildcardMatch("boxd_?", "boxd_drop"));
  });

  test("agents with a base allow get the rules, the others are reported", () => {
    const cfg = {
      agent: {
        builder: { permission: { "*": "allow", boxd_drop: "deny" } },
        careful: { permission: { "*": "ask" } },
        shorthand: { permission: "allow" },
        plain: { model: "x/y" },
        explore: {},
        gone: { disable: true, permission: "deny" },
      },
    };
    const r = addDefaultRules(cfg, TOOLS, "all");
    assert.deepEqual(r, { agentsWithoutRules: ["careful", "explore"], rulesNotAdded: false });
    assert.equal(cfg.agent.builder.permission.boxd_drop, "deny");
    assert.equal(cfg.agent.shorthand.permission.boxd_ensure, "allow");
    assert.equal(cfg.agent.plain.permission.boxd_ensure, "allow");
    assert.equal(cfg.agent.build.permission.boxd_status, "allow", "built-ins get them too");
    assert.equal(cfg.agent.careful.permission.boxd_status, undefined);
    assert.equal(cfg.agent.gone.permission, "deny");
  });

  test("a global base decides for agents without their own", () => {
    const allow = { permission: { "*": "allow" }, agent: { mine: {} } };
    assert.deepEqual(addDefaultRules(allow, TOOLS, "all"), { agentsWithoutRules: [], rulesNotAdded: false });
    assert.deepEqual(Object.keys(allow.permission), ["*", "boxd_*", "boxd_status", "boxd_ensure", "boxd_drop"]);
    assert.equal(allow.agent.mine.permission, undefined);
    const ask = { permission: "ask", agent: { mine: {}, own: { permission: { "*": "allow" } } } };
    assert.deepEqual(addDefaultRules(ask, TOOLS, "all").agentsWithoutRules, ["mine", "build", "plan", "general"]);
    assert.equal(ask.agent.own.permission.boxd_status, "allow");
  });

  test("a config that will not take the rules is RULES_NOT_ADDED", () => {
    const frozen = Object.freeze({ agent: Object.freeze({ builder: Object.freeze({ permission: { "*": "allow" } }) }) });
    assert.equal(addDefaultRules(frozen, TOOLS, "all").rulesNotAdded, true);
  });
});

describe("the skill check (SKILLS_INVALID)", () => {
  test("the shipped skill is valid", () => {
    assert.equal(checkSkill(path.join(REPO, "skills/boxd/SKILL.md")), undefined);
  });
  test("missing or malformed files name the problem", () => {
    const dir = scratch("skill");
    const f = path.join(dir, "SKILL.md");
    assert.match(checkSkill(f), /is missing/);
    fs.writeFileSync(f, "# no frontmatter\n");
    assert.match(checkSkill(f), /no frontmatter/);
    fs.writeFileSync(f, "---\ndescription: x\n---\nbody\n");
    assert.match(checkSkill(f), /no name/);
    fs.writeFileSync(f, "---\nname: other\ndescription: x\n---\nbody\n");
    assert.match(checkSkill(f), /not "boxd"/);
    fs.writeFileSync(f, "---\nname: \"boxd\"\ndescription: x\n---\nbody\n");
    assert.equal(checkSkill(f), undefined);
  });
});

describe("grants and children", { skip: skipNoBuild }, () => {
  test("options: host-only keys stay in the host, the ledger is created 0700, roots are canonical", () => {
    const dir = scratch("grants");
    fs.mkdirSync(path.join(dir, "proj"));
    fs.mkdirSync(path.join(dir, "root"));
    fs.symlinkSync(path.join(dir, "root"), path.join(dir, "root-link"));
    const g = lib.policy.resolveGrants({
      options: { boxd: BOXD_LOCAL, ledgerDir: path.join(dir, "ledger/deep"), allowedRoots: [path.join(dir, "root-link")], access: "read-only" },
      directory: path.join(dir, "proj"),
      env: { PATH: "/usr/bin:/bin", HOME: dir, AWS_SECRET_ACCESS_KEY: "x", BOXD_TOKEN: "t" },
    });
    assert.equal(fs.statSync(path.join(dir, "ledger/deep")).mode & 0o777, 0o700);
    assert.deepEqual(g.preopens, [path.join(dir, "ledger/deep"), path.join(dir, "proj"), path.join(dir, "root")]);
    assert.deepEqual(g.componentOptions, { ledgerDir: path.join(dir, "ledger/deep"), allowedRoots: [path.join(dir, "root")], access: "read-only" });
    assert.deepEqual(g.childEnv, { PATH: "/usr/bin:/bin", HOME: dir, BOXD_TOKEN: "t" }, "only policy.childEnv variables");
    assert.equal(g.programs.boxd, fs.realpathSync(BOXD_LOCAL));
    assert.throws(() => lib.policy.resolveGrants({ options: { allowedRoots: ["/does/not/exist"], ledgerDir: path.join(dir, "l2") }, directory: dir, env: {} }), (e) => e.code === "OPTIONS_INVALID" && /allowedRoots/.test(e.message));
  });

  // These tests are about the runner: the name boxd is granted any arguments and KEEP.
  const anyArgs = [{ name: "boxd", env: ["KEEP"], grants: [{ name: "any", args: ["{rest}"] }] }];
  const grants = (dir, programs) => ({ programs, programPolicies: anyArgs, preopens: [dir], childEnv: { PATH: process.env.PATH, KEEP: "kept" } });
  const text = (r) => Buffer.from(r.val.stdout).toString();

  test("only granted names run; a working directory must lie in a preopen", async () => {
    const dir = scratch("names");
    const g = grants(dir, { boxd: "/bin/echo" });
    for (const name of ["opencode", "sh", "/bin/echo", "boxd ", "BOXD", "../boxd", ""]) {
      const r = await lib.policy.runChild({ program: name, args: [], env: [], timeoutMs: 1000 }, g);
      assert.equal(r.val.tag, "not-allowed", name);
    }
    assert.equal((await lib.policy.runChild({ program: "boxd", args: [], env: [], cwd: "/", timeoutMs: 1000 }, g)).val.tag, "not-allowed");
    const ok = await lib.policy.runChild({ program: "boxd", args: ["a b", "$HOME;"], env: [], cwd: dir, timeoutMs: 5000 }, g);
    assert.equal(ok.tag, "ok");
    assert.equal(text(ok), "a b $HOME;\n", "an argument list, no shell");
  });

  test("the child's environment is the allow-list, the request setting only listed names; stdin arrives byte for byte", async () => {
    const dir = scratch("env");
    process.env.BOXD_BRIDGE_TEST_SECRET = "leak";
    const env = await lib.policy.runChild({ program: "boxd", args: [], env: [["KEEP", "set"]], timeoutMs: 5000 }, grants(dir, { boxd: "/usr/bin/env" }));
    delete process.env.BOXD_BRIDGE_TEST_SECRET;
    // Beside them only the watchdog's mark (lib/watchdog.js), first: a token and a number.
    const [mark, ...rest] = text(env).trim().split("\n");
    assert.match(mark, /^BOXD_BRIDGE_CALL=[0-9a-f]{32}:\d+;$/);
    assert.deepEqual(rest.sort(), [`PATH=${process.env.PATH}`, "KEEP=set"].sort());
    const extra = await lib.policy.runChild({ program: "boxd", args: [], env: [["EXTRA", "1"]], timeoutMs: 5000 }, grants(dir, { boxd: "/usr/bin/env" }));
    assert.deepEqual([extra.tag, extra.val.tag], ["err", "not-allowed"]);
    assert.match(extra.val.val, /boxd may not be given EXTRA/);
    const bytes = new Uint8Array([0, 1, 2, 255, 10, 13]);
    const cat = await lib.policy.runChild({ program: "boxd", args: [], env: [], stdin: bytes, timeoutMs: 5000 }, grants(dir, { boxd: "/bin/cat" }));
    assert.deepEqual([...cat.val.stdout], [...bytes]);
    assert.equal(cat.val.exitCode, 0);
  });

  test("children started together each answer with their own output", async () => {
    const dir = scratch("together");
    const g = grants(dir, { boxd: "/bin/sh" });
    // The first still writes while the others start: each has its own stdout file.
    const runs = ["a", "b", "c"].map((word, i) =>
      lib.policy.runChild({ program: "boxd", args: ["-c", `for n in 1 2 3; do echo ${word}$n; sleep 0.0${3 - i}; done`], env: [], timeoutMs: 5000 }, g),
    );
    const outs = (await Promise.all(runs)).map(text);
    assert.deepEqual(outs, ["a1\na2\na3\n", "b1\nb2\nb3\n", "c1\nc2\nc3\n"]);
  });

  test("a timeout kills the whole process group, grandchildren included", async () => {
    const dir = scratch("timeout");
    const pids = path.join(dir, "pids");
    const started = performance.now();
    const r = await lib.policy.runChild(
      { program: "boxd", args: ["-c", `sleep 30 & echo $! > ${pids}; sleep 30`], env: [], timeoutMs: 300 },
      grants(dir, { boxd: "/bin/sh" }),
    );
    assert.deepEqual(r, { tag: "err", val: { tag: "timed-out" } });
    assert.ok(performance.now() - started < 5000);
    const pid = Number(fs.readFileSync(pids, "utf8"));
    await new Promise((res) => setTimeout(res, 200));
    // Killed, or a zombie nobody reaps (this container's PID 1 does not): either way gone.
    let state = "gone";
    try {
      state = fs.readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1][0];
    } catch {}
    assert.ok(state === "gone" || state === "Z", `the grandchild ${pid} survived (state ${state})`);
  });
});

describe("the worker pool with the real component", { skip: missingPrerequisite() ?? false }, () => {
  function setup(name, options = {}) {
    const dir = scratch(name);
    fs.mkdirSync(path.join(dir, "proj"));
    fs.mkdirSync(path.join(dir, "boxd-local"));
    const env = { PATH: process.env.PATH, HOME: dir, BOXD_LOCAL_HOME: path.join(dir, "boxd-local") };
    const g = lib.policy.resolveGrants({ options: { boxd: BOXD_LOCAL, ledgerDir: path.join(dir, "ledger"), ...options }, directory: path.join(dir, "proj"), env });
    const pool = new lib.pool.Pool(g);
    cleanup.push(() => pool.close());
    const ctx = (facts = {}) => ({
      hostName: "opencode", hostVersion: "1.18.33", optionsJson: JSON.stringify(g.componentOptions), project: g.project, ledger: g.ledger,
      nowMs: Date.now(), entropy: new Uint8Array(32).fill(7), approved: true, opencodeVersion: "1.18.33",
      opencode: { agentsWithoutRules: [], defaultRulesJson: "{}", toolRules: [], rulesNotAdded: false, ...facts },
    });
    return { dir, g, pool, ctx, env };
  }

  test("describe and boxd_status run in a worker", async () => {
    const { pool, ctx } = setup("status");
    const manifest = JSON.parse((await pool.describe()).ok);
    assert.ok(manifest.tools.some((t) => t.name === "boxd_status"));
    const r = await pool.call("boxd_status", "{}", ctx({ agentsWithoutRules: ["careful"] }));
    const status = JSON.parse(r.ok);
    assert.equal(status.boxd.cli, "signed in");
    assert.deepEqual(status.agentsWithoutRules, ["careful"]);
    const e = await pool.call("boxd_drop", '{"work":"nope"}', ctx());
    assert.equal(e.toolError.code, "WORK_UNKNOWN");
  });

  test("boxd_status's two listings run at once (run-all), each answer in its place", async () => {
    // Each listing marks that it started, then waits for the other's mark: one after the
    // other, the first would give up after ~4 s and status would say so.
    const marks = scratch("marks");
    const boxd = path.join(marks, "boxd");
    fs.writeFileSync(boxd, [
      "#!/bin/sh",
      'case "$1 $2" in',
      `  "machine list") me=list; other=snapshots; out='[]' ;;`,
      `  "snapshots list") me=snapshots; other=list; out='[{"name":"opencode-golden","version":"v1","status":"ready"}]' ;;`,
      '  *) echo "error: unexpected boxd $*" >&2; exit 2 ;;',
      "esac",
      `: > "${marks}/$me"`,
      "i=0",
      `while [ ! -e "${marks}/$other" ]; do`,
      "  i=$((i+1))",
      '  if [ $i -gt 80 ]; then echo "error: $me ran alone" >&2; exit 1; fi',
      "  /bin/sleep 0.05",
      "done",
      'echo "$out"',
      "",
    ].join("\n"), { mode: 0o755 });
    const { pool, ctx } = setup("at-once", { boxd });
    const status = JSON.parse((await pool.call("boxd_status", "{}", ctx())).ok);
    assert.equal(status.boxd.cli, "signed in", JSON.stringify(status.boxd));
    assert.deepEqual(status.snapshot, { name: "opencode-golden", present: true, version: "v1", status: "ready" });
    assert.equal(status.boxd.calls, 2);
  });

  test("a failure inside the component is a trap, not a tool error; the next call still works", async () => {
    const { pool, ctx } = setup("trap");
    // A context the glue cannot lower fails inside the call, as a trap would.
    const r = await pool.call("boxd_status", "{}", { ...ctx(), hostName: 42 });
    assert.equal(typeof r.trap, "string");
    assert.equal(r.toolError, undefined);
    assert.equal(JSON.parse((await pool.call("boxd_status", "{}", ctx())).ok).boxd.cli, "signed in");
  });

  test("closing the pool answers a call in flight", async () => {
    const { pool, ctx, env } = setup("close");
    fs.writeFileSync(path.join(env.BOXD_LOCAL_HOME, "faults.json"), JSON.stringify([{ verb: "machine list", times: 1, action: "delay", ms: 3000 }]));
    const pending = pool.call("boxd_status", "{}", ctx());
    await new Promise((res) => setTimeout(res, 500));
    pool.close();
    assert.match((await pending).trap, /shutting down/);
  });

  test("the shim write workaround: a write with mutateDirectory succeeds in the worker", async () => {
    const { g } = setup("probe");
    const probe = await probeWrite(g, g.ledger);
    assert.equal(probe.ok, "probe");
    assert.deepEqual(probe.missing, { file: "no-entry", inMissingFolder: "no-entry", created: "opened" }, "a missing name fails as the shim's open would; create still creates");
  });

  test("a second call does not wait behind a 5-second one", async () => {
    const { pool, ctx, env } = setup("pool");
    fs.writeFileSync(path.join(env.BOXD_LOCAL_HOME, "faults.json"), JSON.stringify([{ verb: "machine list", times: 1, action: "delay", ms: 5000 }]));
    const t0 = performance.now();
    const slow = pool.call("boxd_status", "{}", ctx()).then((r) => ({ r, at: performance.now() - t0 }));
    await new Promise((res) => setTimeout(res, 300));
    const quick = await pool.call("boxd_status", "{}", ctx());
    const quickAt = performance.now() - t0;
    const s = await slow;
    assert.equal(JSON.parse(quick.ok).boxd.cli, "signed in");
    assert.equal(JSON.parse(s.r.ok).boxd.cli, "signed in");
    assert.ok(s.at >= 5000, `the slow call took ${s.at} ms`);
    assert.ok(quickAt < 4000, `the second call finished after ${quickAt} ms`);
    assert.ok(pool.size >= 2);
  });

  test("no boxd on this host: the component is refused the program and says so", async () => {
    const dir = scratch("nocli");
    fs.mkdirSync(path.join(dir, "proj"));
    const g = lib.policy.resolveGrants({ options: { ledgerDir: path.join(dir, "ledger") }, directory: path.join(dir, "proj"), env: { PATH: "/nonexistent", HOME: dir } });
    assert.equal(g.programs.boxd, undefined);
    const pool = new lib.pool.Pool(g);
    try {
      const r = await pool.call("boxd_status", "{}", {
        hostName: "opencode", hostVersion: "1.18.33", optionsJson: "{}", project: g.project, ledger: g.ledger,
        nowMs: Date.now(), entropy: new Uint8Array(32), approved: false,
      });
      const status = JSON.parse(r.ok);
      assert.notEqual(status.boxd.cli, "signed in");
      assert.match(status.boxd.reason, /boxd/);
    } finally {
      pool.close();
    }
  });
});

describe("world version", () => {
  test("the bridge speaks wit/plugin.wit's package and refuses a component of another", async () => {
    const { WIT_PACKAGE, checkWorld } = await import(path.join(PLUGIN, "lib/wit.js"));
    const wit = fs.readFileSync(path.join(REPO, "wit/plugin.wit"), "utf8");
    const pkg = wit.split("\n").map((l) => l.trim()).find((l) => l.startsWith("package ")).slice(8).replace(/;$/, "");
    assert.equal(WIT_PACKAGE, pkg);
    checkWorld({ wit: pkg });
    assert.throws(() => checkWorld({ wit: "boxd:plugin@0.1.9" }), /speaks boxd:plugin@0\.1\.9, this plugin speaks boxd:plugin@0\.1\.0; rebuild the plugin/);
    assert.throws(() => checkWorld({}), /no boxd:plugin world/);
  });

  test("the built component describes the world this bridge speaks", { skip: skipNoBuild }, async () => {
    const { WIT_PACKAGE } = await import(path.join(PLUGIN, "lib/wit.js"));
    const g = lib.policy.resolveGrants({ options: {}, directory: scratch("wit"), env: { PATH: "/nonexistent", HOME: scratch("wit-home") } });
    const pool = new lib.pool.Pool(g);
    try {
      assert.equal(JSON.parse((await pool.describe()).ok).wit, WIT_PACKAGE);
    } finally {
      pool.close();
    }
  });
});

// OpenCode cuts a long tool output and keeps its head (2000 lines or 50 KB, whichever
// first): a harvest of 400 files lost its next step, proof and git state, which came after
// its "files" list. The answer's next step leads, the short fields follow, the longest last.
test("a long answer keeps its next step and short fields at the head OpenCode keeps", async () => {
  const { answerText } = await import(path.join(PLUGIN, "lib/answer.js"));
  const files = Array.from({ length: 400 }, (_, i) => ({ path: `src/f${i}.txt`, sha256: "ab".repeat(32), to: `/p/src/f${i}.txt`, replaced: false }));
  const value = { files, git: { head: "abc", dirty: false }, machine: "oc-w1", next: "The transcript is proven.", owed: [], proven: true, sessions: [{ id: "ses_1" }], work: "w1" };
  const text = answerText(value);
  assert.deepEqual(JSON.parse(text), value, "the same answer");
  const kept = text.split("\n").slice(0, 2000).join("\n").slice(0, 50 * 1024);
  for (const k of ["next", "proven", "git", "owed", "sessions", "work", "machine"]) assert.ok(kept.includes(`"${k}":`), `${k} is in the head: ${kept.slice(0, 300)}`);
  assert.ok(text.indexOf('"next"') < text.indexOf('"proven"') && text.indexOf('"files"') > text.indexOf('"sessions"'), text.slice(0, 400));
  const err = answerText({ next: "n", error: "E", message: "m" });
  assert.deepEqual(Object.keys(JSON.parse(err)), ["error", "message", "next"]);
});
