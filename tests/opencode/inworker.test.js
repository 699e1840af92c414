// Children run by the component's worker itself (host-bridge/opencode/lib/inworker.js):
// the promises runChild keeps on the plugin's thread (bounds.test.js, bridge.test.js),
// kept here with the main thread watching — its own process group killed on timeout,
// grandchildren too; a user abort kills the call's children; floods cut at the caps; a
// daemon holding the output does not hold the answer; children die with the process.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import dc from "node:diagnostics_channel";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Worker } from "node:worker_threads";
import { PLUGIN, missingPrerequisite, notedPid, waitGone } from "./harness.mjs";

const built = fs.existsSync(path.join(PLUGIN, "dist/worker.js"));
const skip = built ? false : "host-bridge/opencode/dist is missing: run npm run build there";
const inworker = built ? await import(path.join(PLUGIN, "lib/inworker.js")) : {};
const poolLib = built ? await import(path.join(PLUGIN, "lib/pool.js")) : {};
const policy = built ? await import(path.join(PLUGIN, "lib/policy.js")) : {};

const cleanup = [];
after(() => {
  for (const f of cleanup.reverse()) f();
});

function scratch(name) {
  const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), `boxd-inworker-${name}-`)));
  cleanup.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

async function readPids(file, n = 2) {
  while (!fs.existsSync(file) || fs.readFileSync(file, "utf8").trim().split("\n").length < n) await new Promise((r) => setTimeout(r, 20));
  return fs.readFileSync(file, "utf8").trim().split("\n").map(Number);
}

// The name boxd is /bin/sh with any arguments: the scripts below play a misbehaving CLI.
const shGrants = (dir) => ({
  programs: { boxd: "/bin/sh" },
  programPolicies: [{ name: "boxd", env: [], grants: [{ name: "any", args: ["{rest}"] }] }],
  preopens: [dir],
  childEnv: { PATH: process.env.PATH },
});

/** A worker thread running requests as the shipped worker does, watched as the pool watches it. */
async function runner(grants) {
  const worker = new Worker(new URL("./inworker-worker.mjs", import.meta.url), { workerData: grants });
  cleanup.push(() => worker.terminate());
  const { tid, shared } = await new Promise((r) => worker.once("message", r));
  assert.ok(tid, "this kernel lists a thread's children (/proc/thread-self/children)");
  const words = new Int32Array(shared);
  let call = 0;
  return {
    tid,
    words,
    run(script, { timeoutMs = 60000, aborted = () => false, watched = true } = {}) {
      call += 1;
      const unwatch = watched ? inworker.watchOutput(tid, words, aborted) : () => {};
      worker.postMessage({ req: { program: "boxd", args: ["-c", script], env: [], timeoutMs, stdinFiles: [], stdoutFiles: [] }, call });
      return new Promise((r) => worker.once("message", r)).finally(unwatch);
    },
    abort() {
      Atomics.store(words, inworker.ABORTED, call);
      inworker.killChildrenOf(tid);
    },
    /** A further spawn of the same call. */
    again(script) {
      worker.postMessage({ req: { program: "boxd", args: ["-c", script], env: [], timeoutMs: 60000 }, call });
      return new Promise((r) => worker.once("message", r));
    },
  };
}

describe("a child run in the worker", { skip }, () => {
  test("only requests with nothing to stream run in the worker", () => {
    assert.equal(inworker.runsInWorker({ stdin: null, stdinFiles: [], stdoutFiles: [] }), true);
    assert.equal(inworker.runsInWorker({ stdin: new Uint8Array([1]), stdinFiles: [], stdoutFiles: [] }), false);
    assert.equal(inworker.runsInWorker({ stdin: null, stdinFiles: [{ path: "/x" }], stdoutFiles: [] }), false);
    assert.equal(inworker.runsInWorker({ stdin: null, stdinFiles: [], stdoutFiles: [{ path: "/x" }] }), false);
  });

  test("the answer: exit code, stdout and stderr; a name not granted is refused", async () => {
    const dir = scratch("answer");
    const r = await (await runner(shGrants(dir))).run("echo out; echo err >&2; exit 3");
    assert.deepEqual(r, { tag: "ok", val: { exitCode: 3, stdout: new Uint8Array(Buffer.from("out\n")), stderr: new Uint8Array(Buffer.from("err\n")), files: [] } });
    const w = new Worker(new URL("./inworker-worker.mjs", import.meta.url), { workerData: shGrants(dir) });
    cleanup.push(() => w.terminate());
    await new Promise((res) => w.once("message", res));
    w.postMessage({ req: { program: "sh", args: [], env: [], timeoutMs: 1000 }, call: 1 });
    const refused = await new Promise((res) => w.once("message", res));
    assert.equal(refused.val.tag, "not-allowed");
  });

  test("a timeout kills the whole process group, grandchildren included", async () => {
    const dir = scratch("timeout");
    const pids = path.join(dir, "pids");
    const r = await (await runner(shGrants(dir))).run(`echo $$ > ${pids}; sleep 30 & echo $! >> ${pids}; sleep 30`, { timeoutMs: 300 });
    assert.deepEqual(r, { tag: "err", val: { tag: "timed-out" } });
    for (const pid of await readPids(pids)) assert.ok(await waitGone(pid), `${pid} survived the timeout`);
  });

  test("an abort kills the call's children, grandchildren included, and refuses its next spawn", async () => {
    const dir = scratch("abort");
    const pids = path.join(dir, "pids");
    const run = await runner(shGrants(dir));
    const answer = run.run(`echo $$ > ${pids}; sleep 300 & echo $! >> ${pids}; sleep 300`);
    const [child, grandchild] = await readPids(pids);
    run.abort();
    const r = await answer;
    assert.equal(r.tag, "ok");
    assert.equal(r.val.exitCode, undefined, "killed by a signal");
    assert.ok(await waitGone(child), "the child survived the abort");
    assert.ok(await waitGone(grandchild), "the grandchild survived the abort");
    // The same call asks again: refused, nothing started.
    const marker = path.join(dir, "started");
    assert.deepEqual(await run.again(`touch ${marker}`), { tag: "err", val: { tag: "failed", val: "the user aborted this tool call" } });
    assert.equal(fs.existsSync(marker), false);
  });

  // Endless floods: only the watch ends them before the timeout.
  test("an endless stdout: the group is killed and the spawn fails naming the cap", async () => {
    const r = await (await runner(shGrants(scratch("out")))).run("cat /dev/zero");
    assert.equal(r.val.tag, "failed");
    assert.match(r.val.val, /printed more than 64 MiB on stdout; the cap is 64 MiB \(host-bridge\/policy.json outputCaps.stdout\)/);
  });

  test("an endless stderr: a failure naming the stderr cap", async () => {
    const r = await (await runner(shGrants(scratch("err")))).run("cat /dev/zero >&2");
    assert.equal(r.val.tag, "failed");
    assert.match(r.val.val, /more than 1 MiB on stderr/);
  });

  // The watch tells the streams apart by file, not by descriptor number: a child that
  // points fd 1 at its stderr file floods stderr (it read as stdout past 64 MiB whenever
  // the watch looked late), and one that points fd 2 at its stdout file may write stdout
  // past 1 MiB (it was killed as past the stderr cap).
  test("a child's own redirections do not change which stream's cap applies", async () => {
    const over = await (await runner(shGrants(scratch("to-err")))).run("exec >&2; head -c 70000000 /dev/zero; sleep 2");
    assert.equal(over.val.tag, "failed");
    assert.match(over.val.val, /more than 1 MiB on stderr/);
    const under = await (await runner(shGrants(scratch("to-out")))).run("exec 2>&1; head -c 2000000 /dev/zero; sleep 0.4");
    assert.equal(under.tag, "ok", JSON.stringify(under.val).slice(0, 300));
    assert.equal(under.val.stdout.length, 2000000);
  });

  // The watch reads the file through the worker's descriptor, so a child that points its
  // own fd 1 away cannot hide a flood from it: before, only the child's timeout or its exit
  // ended one, and 1.8 GB reached /tmp past the 64 MiB cap.
  test("a flood into the stdout file from what the child started, its own fd 1 pointed away, is cut at the cap", async () => {
    const dir = scratch("hidden-flood");
    const pidFile = path.join(dir, "pid");
    const t0 = performance.now();
    const r = await (await runner(shGrants(dir))).run(`cat /dev/zero & echo $! > ${pidFile}; exec >/dev/null; sleep 30; exit 0`);
    const pid = notedPid(pidFile, cleanup);
    assert.match(r.val?.val ?? JSON.stringify(r), /printed more than 64 MiB on stdout/);
    assert.ok(performance.now() - t0 < 15000, `ended after ${Math.round(performance.now() - t0)} ms, not at the cap`);
    assert.ok(await waitGone(pid, 1000), "the background cat outlived the cap");
  });

  test("a cap passed only after the child exited: what it left writing in its group is killed", async () => {
    const dir = scratch("late-cap");
    const pidFile = path.join(dir, "pid");
    // Unwatched, as a watch that looks late sees it: the cap is found when the output is
    // read, after the exit.
    const r = await (await runner(shGrants(dir))).run(`cat /dev/zero & echo $! > ${pidFile}; exec >/dev/null; sleep 1; exit 0`, { watched: false });
    const pid = notedPid(pidFile, cleanup);
    assert.match(r.val?.val ?? JSON.stringify(r), /printed more than 64 MiB on stdout/);
    assert.ok(await waitGone(pid, 1000), "the background cat outlived the cap");
  });

  test("what the child left in its group, writing past a cap after the answer, is killed between calls", async () => {
    const dir = scratch("left-writing");
    const pidFile = path.join(dir, "pid");
    const go = path.join(dir, "answered");
    // The writer starts once the test has the answer, and writes past the stdout cap.
    const r = await (await runner(shGrants(dir))).run(`(until [ -e ${go} ]; do sleep 0.05; done; while :; do head -c 655360 /dev/zero; sleep 0.01; done) </dev/null & echo $! > ${pidFile}; echo '{"ok":true}'`);
    const pid = notedPid(pidFile, cleanup);
    assert.equal(r.tag, "ok", JSON.stringify(r));
    assert.doesNotThrow(() => process.kill(pid, 0), "the writer was killed before it wrote anything");
    fs.writeFileSync(go, "");
    // 64 MiB at ~60 MiB/s: past the stdout cap in about a second, then killed within one more.
    assert.ok(await waitGone(pid, 30000), "what the child left writing outlived the stdout cap after the answer");
  });

  test("a daemon holding stdout and stderr: the answer is what the child printed, and the daemon is left alone", async () => {
    const dir = scratch("daemon");
    const pidFile = path.join(dir, "pid");
    const t0 = performance.now();
    const r = await (await runner(shGrants(dir))).run(`sleep 300 & echo $! > ${pidFile}; echo '{"ok":true}'; exit 0`);
    assert.equal(r.tag, "ok", JSON.stringify(r));
    assert.equal(Buffer.from(r.val.stdout).toString(), '{"ok":true}\n');
    assert.ok(performance.now() - t0 < 10000, `took ${performance.now() - t0} ms`);
    const pid = Number(fs.readFileSync(pidFile, "utf8").trim());
    assert.doesNotThrow(() => process.kill(pid, 0), "the background process was killed; it is not the host's to kill");
    process.kill(pid, "SIGKILL");
  });
});

describe("the pool's children in its workers", { skip: missingPrerequisite() ?? false }, () => {
  // The real component asks for `boxd machine list --json`; boxd is a script that starts a
  // grandchild and hangs, as a stuck CLI would.
  function hangingBoxd(dir) {
    const pids = path.join(dir, "pids");
    return { ...scriptedBoxd(dir, `#!/bin/sh\necho $$ >> ${pids}\nsleep 300 &\necho $! >> ${pids}\nsleep 300\n`), pids };
  }

  /** Grants and a call context with `script` as the boxd CLI. */
  function scriptedBoxd(dir, script) {
    const boxd = path.join(dir, "boxd");
    fs.writeFileSync(boxd, script, { mode: 0o755 });
    fs.mkdirSync(path.join(dir, "proj"));
    const g = policy.resolveGrants({ options: { boxd, ledgerDir: path.join(dir, "ledger") }, directory: path.join(dir, "proj"), env: { PATH: process.env.PATH, HOME: dir } });
    const ctx = () => ({
      hostName: "opencode", hostVersion: "1.18.33", optionsJson: JSON.stringify(g.componentOptions), project: g.project, ledger: g.ledger,
      nowMs: Date.now(), entropy: new Uint8Array(32).fill(7), approved: true, opencodeVersion: "1.18.33",
      opencode: { agentsWithoutRules: [], defaultRulesJson: "{}", toolRules: [], rulesNotAdded: false },
    });
    return { g, ctx };
  }

  test("a user abort kills the children the component's worker started", async () => {
    const { g, ctx, pids } = hangingBoxd(scratch("pool-abort"));
    const pool = new poolLib.Pool(g);
    cleanup.push(() => pool.close());
    const abort = new AbortController();
    const seen = [];
    const answer = pool.call("boxd_status", "{}", ctx(), abort.signal, (req) => seen.push(req.args.join(" ")));
    const [child, grandchild] = await readPids(pids);
    abort.abort();
    const r = await answer;
    assert.ok(r.ok !== undefined || r.toolError !== undefined, JSON.stringify(r));
    assert.ok(await waitGone(child), "the child survived the abort");
    assert.ok(await waitGone(grandchild), "the grandchild survived the abort");
    // boxd_status starts two children at once (run-all); the worker runs machine list.
    assert.ok(seen.some((s) => s.startsWith("machine list")), `progress heard of the child: ${seen}`);
  });

  test("an abort of a call already answered does not reach the next call's children on the same worker", async () => {
    const dir = scratch("pool-stale-abort");
    const marker = path.join(dir, "hang");
    const pids = path.join(dir, "pids");
    // Answers at once until the marker exists; then `machine list` (the child the worker
    // runs itself) notes its pid and hangs.
    const boxd = `#!/bin/sh\nif [ -e ${marker} ] && [ "$1" = machine ]; then echo $$ >> ${pids}; exec sleep 300; fi\necho '[]'\n`;
    const { g, ctx } = scriptedBoxd(dir, boxd);
    const pool = new poolLib.Pool(g, { max: 1 });
    cleanup.push(() => pool.close());
    const a = new AbortController();
    await pool.call("boxd_status", "{}", ctx(), a.signal);
    fs.writeFileSync(marker, "");
    const b = new AbortController();
    const second = pool.call("boxd_status", "{}", ctx(), b.signal);
    const [child] = await readPids(pids, 1);
    a.abort();
    await new Promise((r) => setTimeout(r, 300));
    assert.doesNotThrow(() => process.kill(child, 0), "the first call's abort killed the second call's child");
    b.abort();
    assert.ok(await waitGone(child), "the second call's own abort left its child");
    await second;
  });

  test("an abort while a new worker starts answers aborted and starts no child", async () => {
    const dir = scratch("pool-early-abort");
    const pids = path.join(dir, "pids");
    const { g, ctx } = scriptedBoxd(dir, `#!/bin/sh\necho $$ >> ${pids}\nexec sleep 300\n`);
    const pool = new poolLib.Pool(g);
    cleanup.push(() => pool.close());
    const abort = new AbortController();
    const answer = pool.call("boxd_status", "{}", ctx(), abort.signal);
    abort.abort();
    assert.deepEqual(await answer, { aborted: true });
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(fs.existsSync(pids), false, "a child of the aborted call ran");
  });

  test("a worker that stops mid-call takes the children its call started on the plugin's thread", async () => {
    const dir = scratch("pool-lost");
    const pids = path.join(dir, "pids");
    // `machine list` (the worker's own child) answers at once; `snapshots list`, started on
    // the plugin's thread beside it, notes its pid and hangs.
    const { g, ctx } = scriptedBoxd(dir, `#!/bin/sh\nif [ "$1" = snapshots ]; then echo $$ >> ${pids}; exec sleep 300; fi\necho '[]'\n`);
    const workers = [];
    const onWorker = ({ worker }) => workers.push(worker);
    dc.subscribe("worker_threads", onWorker);
    const pool = new poolLib.Pool(g, { max: 1 });
    cleanup.push(() => pool.close());
    const answer = pool.call("boxd_status", "{}", ctx());
    const [child] = await readPids(pids, 1);
    dc.unsubscribe("worker_threads", onWorker);
    assert.equal(workers.length, 1, "the pool started one worker");
    await workers[0].terminate();
    assert.match((await answer).trap ?? "", /the component worker stopped/);
    assert.ok(await waitGone(child), "the child outlived the worker that asked for it");
  });

  test("a call that waited in the queue carries the time it reached its worker, not the time it was asked", async () => {
    // Every boxd command takes 1.5 s: the first call holds the only worker that long.
    const { g, ctx } = scriptedBoxd(scratch("pool-queued-clock"), "#!/bin/sh\nsleep 1.5\necho '[]'\n");
    const posted = [];
    const onWorker = ({ worker }) => {
      const post = worker.postMessage.bind(worker);
      worker.postMessage = (m, ...rest) => {
        if (m?.ctx) posted.push({ nowMs: m.ctx.nowMs, at: Date.now() });
        return post(m, ...rest);
      };
    };
    dc.subscribe("worker_threads", onWorker);
    const pool = new poolLib.Pool(g, { max: 1 });
    cleanup.push(() => pool.close());
    const first = pool.call("boxd_status", "{}", ctx());
    const asked = ctx();
    const second = pool.call("boxd_status", "{}", asked);
    await Promise.all([first, second]);
    dc.unsubscribe("worker_threads", onWorker);
    assert.equal(posted.length, 2, "both calls reached the one worker");
    const queued = posted[1];
    assert.ok(queued.at - asked.nowMs >= 1000, "the second call waited in the queue");
    // Before: it carried the time it was asked, 1.5 s old (a submit's at_ms in the past).
    assert.ok(queued.at - queued.nowMs < 100, `the queued call's time was ${queued.at - queued.nowMs} ms old when it was posted`);
  });

  test("a call after close answers as a host failure at once", async () => {
    const { g, ctx } = scriptedBoxd(scratch("pool-closed"), "#!/bin/sh\necho '[]'\n");
    const pool = new poolLib.Pool(g);
    pool.close();
    const late = new Promise((r) => setTimeout(() => r("no answer"), 2000).unref());
    assert.deepEqual(await Promise.race([pool.call("boxd_status", "{}", ctx()), late]), { trap: "the plugin is shutting down" });
  });

  test("children in a worker are killed when the plugin's process exits", async () => {
    const dir = scratch("pool-exit");
    const script = `
      const path = await import("node:path");
      const fs = await import("node:fs");
      const policy = await import(${JSON.stringify(path.join(PLUGIN, "lib/policy.js"))});
      const { Pool } = await import(${JSON.stringify(path.join(PLUGIN, "lib/pool.js"))});
      const dir = ${JSON.stringify(dir)};
      const pids = path.join(dir, "pids");
      fs.writeFileSync(path.join(dir, "boxd"), "#!/bin/sh\\necho $$ >> " + pids + "\\nsleep 300 &\\necho $! >> " + pids + "\\nsleep 300\\n", { mode: 0o755 });
      fs.mkdirSync(path.join(dir, "proj"));
      const g = policy.resolveGrants({ options: { boxd: path.join(dir, "boxd"), ledgerDir: path.join(dir, "ledger") }, directory: path.join(dir, "proj"), env: { PATH: process.env.PATH, HOME: dir } });
      const pool = new Pool(g);
      pool.call("boxd_status", "{}", { hostName: "opencode", hostVersion: "1.18.33", optionsJson: "{}", project: g.project, ledger: g.ledger, nowMs: Date.now(), entropy: new Uint8Array(32), approved: true });
      while (!fs.existsSync(pids) || fs.readFileSync(pids, "utf8").trim().split("\\n").length < 2) await new Promise((r) => setTimeout(r, 20));
      process.exit(0);
    `;
    // A file, not -e: a worker inherits the process's flags, and --input-type fails it.
    fs.writeFileSync(path.join(dir, "plugin.mjs"), script);
    execFileSync(process.execPath, [path.join(dir, "plugin.mjs")], { stdio: "inherit", timeout: 60000 });
    for (const pid of await readPids(path.join(dir, "pids"))) assert.ok(await waitGone(pid), `${pid} outlived the plugin's process`);
  });
});
