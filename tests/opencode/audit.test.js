// The bridge's audit log (plugin option `auditLog`, lib/audit.js), as boxd-host's
// `--audit-log`: one owner-only JSON line per tool call, each spawn request in it once with
// the grant it matched (null when refused), its outcome and its masked arguments, from both
// spawn paths (a child run in the worker, one run on the plugin's thread). The test-only
// probe component ($BOXD_PROBE_WASM) makes the requests, as in policy_vectors.test.js.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { PLUGIN, probePluginHooks } from "./harness.mjs";

const PROBE = process.env.BOXD_PROBE_WASM;
const built = fs.existsSync(path.join(PLUGIN, "dist/policy.json"));

describe("the bridge's audit log", { skip: built && PROBE ? false : "needs dist/ and BOXD_PROBE_WASM (tests/host/opencode.rs sets both)" }, () => {
  const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "boxd-audit-")));
  const log = path.join(dir, "audit.jsonl");
  let hooks;
  after(async () => {
    await hooks?.dispose();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  /** A probe tool as OpenCode calls it, the plugin loaded with `options` on first use. */
  async function call(tool, args, options = { auditLog: log }) {
    if (!hooks) {
      hooks = await probePluginHooks(dir, PROBE, options);
    }
    const ctx = { sessionID: "ses_probe", abort: new AbortController().signal, metadata() {}, async ask() {} };
    return (await hooks.tool[tool].execute(args, ctx)).output;
  }

  const lines = () => fs.readFileSync(log, "utf8").trim().split("\n").map((l) => JSON.parse(l));
  const spawnsOf = (ls) => ls.flatMap((l) => l.spawns);
  const asked = (argv) => (s) => JSON.stringify([s.program, ...s.args]) === JSON.stringify(argv);

  test("a refused request and an allowed one each appear exactly once, with the grant they matched", { timeout: 120000 }, async () => {
    const refused = ["boxd", "auth", "logout"];
    const allowed = ["opencode", "--version"];
    assert.ok((await call("spawn", { argv: refused })).startsWith("not-allowed: "));
    assert.equal(await call("spawn", { argv: allowed }), "ok exit=Some(0)");
    const ls = lines();
    assert.equal(ls.length, 2, "one line per tool call");
    assert.deepEqual(ls.map((l) => [l.tool, l.result]), [["spawn", "ok"], ["spawn", "ok"]]);
    const no = spawnsOf(ls).filter(asked(refused));
    const yes = spawnsOf(ls).filter(asked(allowed));
    assert.equal(no.length, 1, JSON.stringify(ls));
    assert.equal(yes.length, 1, JSON.stringify(ls));
    assert.deepEqual({ ...no[0], duration_ms: 0 }, { program: "boxd", args: ["auth", "logout"], grant: null, exit_code: null, outcome: "not-allowed", duration_ms: 0 });
    assert.deepEqual({ ...yes[0], duration_ms: 0 }, { program: "opencode", args: ["--version"], grant: "opencode version", exit_code: 0, outcome: "exited", duration_ms: 0 });
    assert.equal((fs.statSync(log).mode & 0o777).toString(8), "600", "the log is owner-only");
  });

  test("a run-all's requests are each recorded once, the one run in the worker and the one run on the plugin's thread", { timeout: 120000 }, async () => {
    const before = lines().length;
    const inWorker = ["boxd", "machine", "list", "--json"];
    const onThread = ["boxd", "env", "list", "--json"];
    assert.equal(await call("spawn-all", { argvs: [inWorker, onThread] }), "ok exit=Some(0)\nok exit=Some(0)");
    const ls = lines().slice(before);
    assert.equal(ls.length, 1, "one line for the one tool call");
    assert.deepEqual(ls[0].spawns.map((s) => [s.grant, s.outcome]), [["boxd machine-list", "exited"], ["boxd env-list", "exited"]]);
  });

  // Aborted while its child ran (OpenCode's Esc): the child is killed, and an answer that
  // took its death for the guest's or the CLI's failure ends the call as aborted, its line
  // saying so (a guest "killed by a signal" told the user to rebuild a machine that was
  // fine). Any other answer stands: a success, or an error whose own next step says what
  // is uncertain.
  test("a call aborted while its child runs ends as aborted, and its line says so", { timeout: 120000 }, async () => {
    const slow = path.join(dir, "slow-boxd");
    const pidFile = path.join(dir, "slow.pid");
    fs.writeFileSync(slow, `#!/bin/sh\necho $$ > ${pidFile}\nexec sleep 30\n`, { mode: 0o755 });
    const own = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "boxd-audit-abort-")));
    const ownLog = path.join(own, "audit.jsonl");
    const h = await probePluginHooks(own, PROBE, { auditLog: ownLog, boxd: slow });
    /** The probe's spawn of the slow boxd, aborted once the child runs; its outcome. */
    const aborted = async (extra) => {
      fs.rmSync(pidFile, { force: true });
      const abort = new AbortController();
      const ctx = { sessionID: "ses_probe", abort: abort.signal, metadata() {}, async ask() {} };
      const call = h.tool.spawn.execute({ argv: ["boxd", "machine", "list", "--json"], ...extra }, ctx);
      const started = Date.now();
      while (!fs.existsSync(pidFile) && Date.now() - started < 30000) await new Promise((r) => setTimeout(r, 20));
      const pid = Number(fs.readFileSync(pidFile, "utf8"));
      abort.abort();
      const out = await call.then((r) => r.output, (e) => ({ thrown: e.message }));
      assert.throws(() => process.kill(pid, 0), /ESRCH/, "the child was killed");
      return out;
    };
    try {
      assert.deepEqual(await aborted({ failWith: "GUEST_FAILED" }), { thrown: "spawn was aborted" });
      const [line] = fs.readFileSync(ownLog, "utf8").trim().split("\n").map((l) => JSON.parse(l));
      assert.deepEqual(line.result, { thrown: "spawn was aborted" }, JSON.stringify(line));
      assert.match(await aborted({ failWith: "CREATE_UNCERTAIN" }), /"error": "CREATE_UNCERTAIN"/, "an uncertain outcome's own answer stands");
      assert.equal(await aborted({}), "ok exit=None", "a success stands");
    } finally {
      await h.dispose();
      fs.rmSync(own, { recursive: true, force: true });
    }
  });

  test("a credential in a granted request's arguments is masked", { timeout: 120000 }, async () => {
    const before = lines().length;
    const argv = ["boxd", "machine", "exec", "oc-w1", "--timeout", "60", "--", "env", "BOXD_TOKEN=bxd_s3cret", "true"];
    assert.equal(await call("spawn", { argv }), "ok exit=Some(0)");
    const [line] = lines().slice(before);
    assert.deepEqual(line.spawns[0].args, ["machine", "exec", "oc-w1", "--timeout", "60", "--", "env", "BOXD_TOKEN=***", "true"]);
    assert.equal(line.spawns[0].grant, "boxd machine-exec");
    assert.ok(!fs.readFileSync(log, "utf8").includes("s3cret"));
  });
});

// lib/audit.js's file handling alone (no probe needed): whole lines from several processes
// at once, a removed log made again, and the paths it refuses.
describe("the bridge's audit log file", () => {
  const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "boxd-auditfile-")));
  const lib = path.join(PLUGIN, "lib/audit.js");
  after(() => fs.rmSync(dir, { recursive: true, force: true }));

  test("lines from eight processes writing at once are each whole", { timeout: 60000 }, async () => {
    const log = path.join(dir, "many.jsonl");
    const { spawn } = await import("node:child_process");
    const writer = `import { openAuditLog } from ${JSON.stringify(lib)};
      const l = openAuditLog(${JSON.stringify(log)});
      const spawns = Array.from({ length: 40 }, (_, i) => ({ program: "boxd", args: ["machine", "get", "oc-" + "x".repeat(i)], grant: "boxd machine-get", exit_code: 0, outcome: "exited", duration_ms: i }));
      for (let i = 0; i < 50; i++) l.record("boxd_status", i, "ok", spawns);`;
    const runs = Array.from({ length: 8 }, () => new Promise((resolve) => spawn(process.execPath, ["--input-type=module", "-e", writer], { stdio: "inherit" }).on("exit", resolve)));
    assert.deepEqual(await Promise.all(runs), Array(8).fill(0));
    const text = fs.readFileSync(log, "utf8").trim().split("\n");
    assert.equal(text.length, 400);
    for (const l of text) assert.equal(JSON.parse(l).tool, "boxd_status");
  });

  test("a removed log is made again at its path; a FIFO, a device or a symbolic link is refused; a 0644 log becomes 0600", async () => {
    const { openAuditLog } = await import(lib);
    const log = path.join(dir, "gone.jsonl");
    const l = openAuditLog(log);
    l.record("one", 1, "ok", []);
    fs.rmSync(log);
    l.record("two", 1, "ok", []);
    l.close();
    assert.deepEqual(fs.readFileSync(log, "utf8").trim().split("\n").map((x) => JSON.parse(x).tool), ["two"]);
    assert.equal(fs.statSync(log).mode & 0o777, 0o600);

    const fifo = path.join(dir, "fifo");
    (await import("node:child_process")).execFileSync("mkfifo", [fifo]);
    assert.throws(() => openAuditLog(fifo), /FIFO/);
    assert.throws(() => openAuditLog("/dev/full"), /not a regular file/);
    const link = path.join(dir, "link.jsonl");
    fs.symlinkSync(path.join(dir, "target.jsonl"), link);
    assert.throws(() => openAuditLog(link), /symbolic link/);
    assert.equal(fs.existsSync(path.join(dir, "target.jsonl")), false);

    const old = path.join(dir, "old.jsonl");
    fs.writeFileSync(old, "", { mode: 0o644 });
    fs.chmodSync(old, 0o644);
    openAuditLog(old).close();
    assert.equal(fs.statSync(old).mode & 0o777, 0o600);
  });
});
