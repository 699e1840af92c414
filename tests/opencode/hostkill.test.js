// The laptop's OpenCode killed (SIGKILL) or stopped (SIGTERM: OpenCode 1.18 then exits
// without running the plugin's exit handler) in the middle of a change tool: the boxd call
// the plugin was running dies with it, as boxd-host's children do (PR_SET_PDEATHSIG),
// instead of running on alone — a hung one for ever — and boxd-host then recovers the work
// from the ledger. Real `opencode serve` with the plugin, boxd-local with a `hang` fault.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { BOXD_HOST, BOXD_LOCAL, Laptop, OPENCODE, PLUGIN, gone, missingPrerequisite, waitGone } from "./harness.mjs";

const skip = missingPrerequisite() ?? (fs.existsSync(BOXD_HOST) ? false : `${BOXD_HOST} is missing: cargo build -p boxd-host`);
const T = { timeout: 240000 };

/** SIGKILL the group `pid` leads, if any is left. */
function kill(pid) {
  try {
    process.kill(-pid, "SIGKILL");
  } catch {}
}

/** The processes whose parent is `ppid`: [{pid, argv}]. */
function childrenOf(ppid) {
  const out = [];
  for (const name of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${name}/stat`, "utf8");
      if (Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]) !== ppid) continue;
      out.push({ pid: Number(name), argv: fs.readFileSync(`/proc/${name}/cmdline`, "utf8").split("\0") });
    } catch {}
  }
  return out;
}

describe("OpenCode killed or stopped mid-call", { skip }, () => {
  const left = [];
  const laptops = [];
  after(() => {
    // Whatever outlived its host (the old behaviour) is ended here, by pid.
    for (const pid of left) kill(pid);
    for (const l of laptops) l.stop();
  });

  for (const signal of ["SIGKILL", "SIGTERM"]) test(`${signal}: the boxd call it ran dies with it, and boxd-host recovers the work`, T, async () => {
    const l = await Laptop.start("hostkill", {});
    laptops.push(l);
    l.seedGuestGolden();
    l.faults([{ verb: "machine new", times: 1, action: "hang" }]); // hangs for ever
    const serve = l.children.at(-1);
    await l.promptAsync(await l.session(), '@@tool:boxd_ensure:{"work":"w1"}@@');
    const create = await l.waitFor("the plugin's boxd machine new", async () =>
      childrenOf(serve.pid).find((c) => c.argv[0] === BOXD_LOCAL && c.argv[1] === "machine" && c.argv[2] === "new"), 90000, 50);
    left.push(create.pid);
    const watchdog = childrenOf(serve.pid).find((c) => c.argv[0] === "/bin/sh" && c.argv[1] === "-c");
    if (watchdog) left.push(watchdog.pid);

    process.kill(serve.pid, signal);
    assert.ok(await waitGone(serve.pid, 15000), `opencode did not exit on ${signal}`);
    assert.ok(await waitGone(create.pid, 10000), "boxd machine new outlived the OpenCode that ran it");
    if (watchdog) assert.ok(await waitGone(watchdog.pid, 10000), "the watchdog stayed after its work was done");

    // The same call again through the other host, on the same ledger: the work is
    // recovered, with one machine.
    l.faults([]);
    const out = execFileSync(BOXD_HOST, ["--project", l.project, "--ledger", l.ledger, "--boxd", BOXD_LOCAL, "--opencode", OPENCODE, "call", "boxd_ensure", '{"work":"w1"}'], { env: l.env, encoding: "utf8", timeout: 180000 });
    assert.equal(JSON.parse(out).machine, "oc-w1", out);
    const machines = JSON.parse(l.boxd("machine", "list", "--json")).map((m) => m.name);
    assert.deepEqual(machines, ["oc-w1"]);
    const record = JSON.parse(fs.readFileSync(path.join(l.ledger, "works/w1/work.json"), "utf8"));
    assert.equal(record.state, "open");
  });

  // A disposed plugin leaves no process behind: its watchdog ends once the last child it
  // guards is answered (never before), and the next child starts another. Under Node and
  // under Bun, where the watchdog is started and ended through Bun.spawn's stdin.
  for (const runtime of ["node", "bun"]) test(`${runtime}: the watchdog ends when the plugin is disposed and no child is left to guard`, async () => {
    const seen = JSON.parse(runScript(runtime, `
      const child = () => spawn("sleep", ["30"], { detached: true, stdio: "ignore" });
      const a = child();
      const unguardA = w.guard(a.pid);
      const first = w.watchdogPid;
      const ran = Boolean(first) && !gone(first);
      w.idle(); // disposed, with a child still running: it keeps watching
      const keptWhileGuarded = !(await waitGone(first, 500));
      unguardA();
      const ended = await waitGone(first, 10000);
      const answeredLeft = !(await waitGone(a.pid, 300));
      const b = child();
      const unguardB = w.guard(b.pid);
      const another = Boolean(w.watchdogPid) && w.watchdogPid !== first && !gone(w.watchdogPid);
      unguardB();
      for (const c of [a, b]) process.kill(-c.pid, "SIGKILL");
      say({ ran, keptWhileGuarded, ended, answeredLeft, another });`));
    assert.ok(seen.ran, "a watchdog runs while a child is guarded");
    assert.ok(seen.keptWhileGuarded, "the watchdog ended while a child was still guarded");
    assert.ok(seen.ended, "the watchdog outlived the disposed plugin");
    assert.ok(seen.answeredLeft, "a child already answered is not the watchdog's to kill");
    assert.ok(seen.another, "the next child starts another watchdog");
  });

  // A watchdog killed by someone else while it guards a child: the next one is started at
  // once and told of that child, so the child still dies with the plugin's process, as
  // does one guarded after. Before, every later child was guarded by no one.
  for (const runtime of ["node", "bun"]) test(`${runtime}: a watchdog killed by someone else is replaced, and its children still guarded`, async () => {
    const seen = JSON.parse(runScript(runtime, `
      const child = () => spawn("sleep", ["30"], { detached: true, stdio: "ignore" });
      const before = child();
      w.guard(before.pid);
      const first = await killWatchdog();
      const after = child();
      w.guard(after.pid);
      say({ before: before.pid, after: after.pid, first, second: w.watchdogPid });
      for (const t = Date.now(); Date.now() - t < 50; );
      process.kill(process.pid, "SIGKILL");`));
    assert.ok(seen.second && seen.second !== seen.first, `no watchdog took over from the one killed (${JSON.stringify(seen)})`);
    assert.ok(await waitGone(seen.before, 10000), "a child guarded by the killed watchdog outlived its process");
    assert.ok(await waitGone(seen.after, 10000), "a child guarded after the watchdog was killed outlived its process");
    assert.ok(await waitGone(seen.second, 10000), "the watchdog that took over stayed after its work was done");
  });

  // A pid still guarded but no longer the plugin's child (reaped, its answer not yet taken
  // back, the pid used again by another process): the watchdog that takes over is not told
  // of it, so that other process is not killed with the plugin. Here the other process is
  // the test's own child, guarded by the plugin's process as if it were its own.
  for (const runtime of ["node", "bun"]) test(`${runtime}: a watchdog that takes over is told only of the plugin's own children`, async () => {
    const stranger = spawn("sleep", ["30"], { detached: true, stdio: "ignore" });
    try {
      const seen = JSON.parse(runScript(runtime, `
        w.guard(${stranger.pid});
        const first = await killWatchdog();
        say({ first, second: w.watchdogPid });
        for (const t = Date.now(); Date.now() - t < 50; );
        process.kill(process.pid, "SIGKILL");`));
      assert.ok(seen.second && seen.second !== seen.first, `no watchdog took over (${JSON.stringify(seen)})`);
      assert.ok(await waitGone(seen.second, 10000), "the watchdog that took over stayed after its work was done");
      assert.equal(gone(stranger.pid), false, "a process that was not the plugin's child was killed with the plugin");
    } finally {
      process.kill(-stranger.pid, "SIGKILL");
    }
  });

  // A process killed the moment after it started a child: the child is guarded from its
  // first instant (the watchdog, not the plugin, reads /proc for it), and one already
  // answered is left alone. Under Node and under Bun, OpenCode's runtime, whose
  // child_process left the line for the next turn of the event loop: the thread is kept
  // busy between the guard and the kill, as the plugin's is while it starts the next child.
  for (const runtime of ["node", "bun"]) test(`${runtime}: a child is guarded from its start: the process killed at once takes it along`, async () => {
    const pids = JSON.parse(runScript(runtime, `
      const child = () => spawn("sleep", ["30"], { detached: true, stdio: "ignore" });
      const answered = child();
      w.guard(answered.pid)();
      const running = child();
      w.guard(running.pid);
      say({ answered: answered.pid, running: running.pid, watchdog: w.watchdogPid });
      for (const t = Date.now(); Date.now() - t < 50; );
      process.kill(process.pid, "SIGKILL");`));
    assert.ok(await waitGone(pids.running, 10000), "a child started just before its process was killed outlived it");
    assert.ok(await waitGone(pids.watchdog, 10000), "the watchdog stayed after its work was done");
    assert.equal(await waitGone(pids.answered, 300), false, "a child already answered is not the watchdog's to kill");
    process.kill(-pids.answered, "SIGKILL");
  });

  // A pid still listed when the process dies, but given to another process after its "+"
  // was read (as a child reaped just before the kill, its "-" never written, whose pid the
  // system handed out again): that process started later, and is left alone. Pids are handed
  // out in turn, so pids some way ahead are announced, the ones before them used up by
  // processes that end at once, and the processes started next take them. Ahead by 200:
  // no process anyone starts before the watchdog has read the lines takes one (were it
  // still running at the end, the watchdog would rightly take it for the plugin's child).
  // Where others ran past those pids meanwhile (a busy machine), pids further ahead are.
  for (const runtime of ["node", "bun"]) test(`${runtime}: a process given an announced pid after its announcement is left alone`, async () => {
    const seen = JSON.parse(runScript(runtime, `
      const ended = (child) => new Promise((r) => child.on("exit", r));
      const probe = spawn("true", [], { stdio: "ignore" });
      w.guard(probe.pid)(); // the watchdog started (it takes a pid too) before any is chosen
      await ended(probe);
      let next = Math.max(probe.pid, w.watchdogPid) + 1;
      const announced = [];
      let later = [];
      for (let round = 0; round < 5 && !later.length; round++) {
        const first = next + 200;
        const ahead = Array.from({ length: 40 }, (_, i) => first + i);
        for (const pid of ahead) w.guard(pid);
        announced.push(...ahead);
        // Past the boot clock's tick (10 ms) in which the watchdog read the lines.
        await new Promise((r) => setTimeout(r, 30));
        let used;
        for (let n = 0; n < 400; n++) {
          used = spawn("true", [], { stdio: "ignore" });
          await ended(used);
          if (used.pid >= first - 1 || used.pid < next - 1) break;
        }
        next = used.pid + 1;
        if (used.pid < first - 1 || used.pid > first + 20) continue; // wrapped, or run past
        later = ahead.map(() => spawn("sleep", ["30"], { detached: true, stdio: "ignore" }).pid);
      }
      say({ announced, later, watchdog: w.watchdogPid });
      for (const t = Date.now(); Date.now() - t < 50; );
      process.kill(process.pid, "SIGKILL");`));
    try {
      const taken = seen.later.filter((pid) => seen.announced.includes(pid));
      assert.ok(taken.length > 0, `no process started later was given an announced pid, so nothing was checked (${JSON.stringify(seen)})`);
      assert.ok(await waitGone(seen.watchdog, 10000), "the watchdog stayed after its work was done");
      const killed = taken.filter((pid) => gone(pid));
      assert.deepEqual(killed, [], "the watchdog killed processes that took an announced pid after the announcement");
    } finally {
      for (const pid of seen.later) kill(pid);
    }
  });
});

/**
 * Run `body` as a module under `runtime` (node, or bun: OpenCode's own binary), with
 * lib/watchdog.js as `w`, spawn, harness's gone and waitGone, `killWatchdog()`, and
 * `say(value)` writing one JSON line to stdout at once (the process may kill itself next).
 * Returns its stdout,
 * however it ended.
 */
function runScript(runtime, body) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "boxd-watchdog-"));
  const script = path.join(dir, "script.mjs");
  fs.writeFileSync(script, `
    import { spawn } from "node:child_process";
    import fs from "node:fs";
    const w = await import(${JSON.stringify(path.join(PLUGIN, "lib/watchdog.js"))});
    const { gone, waitGone } = await import(${JSON.stringify(new URL("./harness.mjs", import.meta.url).pathname)});
    const say = (value) => fs.writeSync(1, JSON.stringify(value));
    // SIGKILL the watchdog as someone else would, and wait for the next (at most 10 s); its pid.
    const killWatchdog = async () => {
      const first = w.watchdogPid;
      process.kill(first, "SIGKILL");
      for (const t = Date.now(); !(w.watchdogPid && w.watchdogPid !== first) && Date.now() - t < 10000; ) await new Promise((r) => setTimeout(r, 10));
      return first;
    };
    ${body}`);
  const [bin, env] = runtime === "bun" ? [OPENCODE, { ...process.env, BUN_BE_BUN: "1" }] : [process.execPath, process.env];
  try {
    return execFileSync(bin, [script], { encoding: "utf8", env, timeout: 60000 });
  } catch (e) {
    return e.stdout;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
