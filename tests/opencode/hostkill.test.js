// The laptop's OpenCode killed (SIGKILL) or stopped (SIGTERM: OpenCode 1.18 then exits
// without running the plugin's exit handler) in the middle of a change tool: the boxd call
// the plugin was running dies with it, as boxd-host's children do (PR_SET_PDEATHSIG),
// instead of running on alone — a hung one for ever — and boxd-host then recovers the work
// from the ledger. Real `opencode serve` with the plugin, boxd-local with a `hang` fault.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn, spawnSync } from "node:child_process";
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

  // A disposed plugin leaves no process behind: its watchdog ends once the last mark it
  // holds is taken back (never before), and the next mark starts another. Under Node and
  // under Bun, where the watchdog is started and ended through Bun.spawn's stdin.
  for (const runtime of ["node", "bun"]) test(`${runtime}: the watchdog ends when the plugin is disposed and no child is left to guard`, async () => {
    const seen = JSON.parse(runScript(runtime, `
      const ma = w.mark();
      const a = child(ma);
      const first = w.watchdogPid;
      const ran = Boolean(first) && !gone(first);
      w.idle(); // disposed, with a child still running: it keeps watching
      const keptWhileGuarded = !(await waitGone(first, 500));
      ma.release();
      const ended = await waitGone(first, 10000);
      const answeredLeft = !(await waitGone(a.pid, 300));
      const mb = w.mark();
      const b = child(mb);
      const another = Boolean(w.watchdogPid) && w.watchdogPid !== first && !gone(w.watchdogPid);
      mb.release();
      for (const c of [a, b]) process.kill(-c.pid, "SIGKILL");
      say({ ran, keptWhileGuarded, ended, answeredLeft, another });`));
    assert.ok(seen.ran, "a watchdog runs while a child is guarded");
    assert.ok(seen.keptWhileGuarded, "the watchdog ended while a child was still guarded");
    assert.ok(seen.ended, "the watchdog outlived the disposed plugin");
    assert.ok(seen.answeredLeft, "a child already answered is not the watchdog's to kill");
    assert.ok(seen.another, "the next child starts another watchdog");
  });

  // A watchdog killed by someone else while it guards a child: the next one is started at
  // once and told of the marks still held, and of the parts of them taken back, so the
  // child still dies with the plugin's process, as does one guarded after, and a reaped
  // worker child's leftover (its part taken back) is still left alone.
  for (const runtime of ["node", "bun"]) test(`${runtime}: a watchdog killed by someone else is replaced, and its children still guarded`, async () => {
    const seen = JSON.parse(runScript(runtime, `
      const before = child(w.mark());
      const call = w.mark();
      const part = (k) => spawn("sleep", ["30"], { detached: true, stdio: "ignore", env: w.marked(w.partOf(call.parts, k), { PATH: process.env.PATH }) });
      const reaped = part(1);
      const running = part(2);
      call.releasePart(1);
      const first = await killWatchdog();
      const after = child(w.mark());
      say({ before: before.pid, after: after.pid, reaped: reaped.pid, running: running.pid, first, second: w.watchdogPid });
      for (const t = Date.now(); Date.now() - t < 50; );
      process.kill(process.pid, "SIGKILL");`));
    assert.ok(seen.second && seen.second !== seen.first, `no watchdog took over from the one killed (${JSON.stringify(seen)})`);
    assert.ok(await waitGone(seen.before, 10000), "a child guarded by the killed watchdog outlived its process");
    assert.ok(await waitGone(seen.after, 10000), "a child guarded after the watchdog was killed outlived its process");
    assert.ok(await waitGone(seen.running, 10000), "a worker child still running outlived its process");
    assert.ok(await waitGone(seen.second, 10000), "the watchdog that took over stayed after its work was done");
    left.push(seen.reaped);
    assert.equal(gone(seen.reaped), false, "the watchdog that took over killed what a reaped worker child left running");
  });

  // The watchdog kills only groups whose leader carries a mark of this process still held.
  // Left alone: a child whose mark was taken back (answered), and what it started in a
  // group of its own; a process with no mark (the test's own, or the plugin's watchdog-less
  // child); one carrying the same variable with another token (another OpenCode's child,
  // or a forgery). Killed: a child with a mark still held, with its grandchild, and a group
  // it made itself with the environment it was given (part of a call never answered); and
  // wherever the mark sits in the environment: a shell in between (a wrapper script, a
  // shim, `sh -c 'exec …'`, bash running its last command) reorders what it execs.
  for (const runtime of ["node", "bun"]) test(`${runtime}: the watchdog kills only the groups that carry a mark of its process still held`, async () => {
    const stranger = spawn("sleep", ["30"], { detached: true, stdio: "ignore" });
    left.push(stranger.pid);
    const seen = JSON.parse(runScript(runtime, `
      const held = w.mark();
      const [name, value] = held.env;
      const answered = w.mark();
      const pids = {
        // sh: its own pid, a grandchild in its group, and one that leads a group of its own.
        held: spawn("/bin/sh", ["-c", "sleep 30 & echo $!; setsid sleep 30 & echo $!; sleep 30"], { detached: true, stdio: ["ignore", "pipe", "ignore"], env: w.marked(held.env, { PATH: process.env.PATH }) }),
        wrapped: spawn("/bin/sh", ["-c", "exec sleep 30"], { detached: true, stdio: "ignore", env: w.marked(held.env, { PATH: process.env.PATH, HOME: "/nowhere", A: "1" }) }),
        markLast: spawn("sleep", ["30"], { detached: true, stdio: "ignore", env: { A: "1", PATH: process.env.PATH, [name]: value } }),
        answered: spawn("/bin/sh", ["-c", "setsid sleep 30 & sleep 30"], { detached: true, stdio: "ignore", env: w.marked(answered.env, { PATH: process.env.PATH }) }),
        unmarked: child(null),
        otherToken: spawn("sleep", ["30"], { detached: true, stdio: "ignore", env: { [name]: "0".repeat(32) + value.slice(32) } }),
      };
      // A process name with a newline in it (the name is the program file's): /proc/PID/stat
      // then spans two lines.
      const nl = fs.mkdtempSync("/tmp/boxd-watchdog-nl-");
      fs.symlinkSync("/bin/sleep", nl + "/a\\nb");
      pids.newline = spawn(nl + "/a\\nb", ["30"], { detached: true, stdio: "ignore", env: w.marked(held.env, { PATH: process.env.PATH }) });
      if (fs.existsSync("/bin/bash")) pids.bash = spawn("/bin/bash", ["-c", "true; sleep 30"], { detached: true, stdio: "ignore", env: w.marked(held.env, { PATH: process.env.PATH, HOME: "/nowhere" }) });
      let out = "";
      pids.held.stdout.on("data", (d) => (out += d));
      while (out.split("\\n").length < 3) await new Promise((r) => setTimeout(r, 10));
      const [grandchild, ownGroup] = out.split("\\n").map(Number);
      await new Promise((r) => setTimeout(r, 200)); // the setsid children started
      fs.rmSync(nl, { recursive: true, force: true });
      answered.release();
      say({ ...Object.fromEntries(Object.entries(pids).map(([k, c]) => [k, c.pid])), grandchild, ownGroup, watchdog: w.watchdogPid });
      process.kill(process.pid, "SIGKILL");`));
    // What the answered child started: its sleep, and the `setsid` one (which execs sleep).
    const answeredOwn = childrenOf(seen.answered).map((c) => c.pid);
    try {
      assert.ok(await waitGone(seen.watchdog, 10000), "the watchdog stayed after its work was done");
      assert.ok(await waitGone(seen.held, 10000), "a child whose mark was held outlived the plugin");
      assert.ok(await waitGone(seen.grandchild, 10000), "a grandchild in the held child's group outlived the plugin");
      assert.ok(await waitGone(seen.ownGroup, 10000), "a group the held child made, with its environment, outlived the plugin");
      for (const what of ["wrapped", "markLast", "bash", "newline"].filter((k) => seen[k])) {
        assert.ok(await waitGone(seen[what], 10000), `a held child outlived the plugin (${what}: its mark moved from first place, or its name holding a newline)`);
      }
      for (const [what, pid] of [["answered", seen.answered], ["unmarked", seen.unmarked], ["otherToken", seen.otherToken]]) {
        assert.equal(gone(pid), false, `the watchdog killed a process it should have left alone (${what})`);
      }
      assert.ok(answeredOwn.length > 0 && answeredOwn.every((pid) => !gone(pid)), "what an answered child started in a group of its own was killed");
      assert.equal(gone(stranger.pid), false, "a process that was not the plugin's was killed with the plugin");
    } finally {
      for (const pid of [seen.answered, seen.unmarked, seen.otherToken, ...answeredOwn, stranger.pid]) kill(pid);
    }
  });

  // Two plugin processes at once (two OpenCodes), each with its own watchdog: the one killed
  // takes only its own children. The other's child carries the same variable with the other
  // process's token, and is left until its own process dies, when its watchdog takes it.
  for (const runtime of ["node", "bun"]) test(`${runtime}: of two plugin processes at once, the one killed takes only its own children`, async () => {
    const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "boxd-watchdog-two-")));
    const other = path.join(dir, "other.mjs");
    // The other plugin process: marks a child, says its pids, and runs on until killed.
    fs.writeFileSync(other, `
      import { spawn } from "node:child_process";
      import fs from "node:fs";
      const w = await import(${JSON.stringify(path.join(PLUGIN, "lib/watchdog.js"))});
      const c = spawn("sleep", ["30"], { detached: true, stdio: "ignore", env: w.marked(w.mark().env, { PATH: process.env.PATH }) });
      fs.writeSync(1, JSON.stringify({ process: process.pid, child: c.pid, watchdog: w.watchdogPid }) + "\\n");
      setInterval(() => {}, 1000);`);
    let seen;
    try {
      seen = JSON.parse(runScript(runtime, `
        const o = spawn(process.execPath, [${JSON.stringify(other)}], { stdio: ["ignore", "pipe", "ignore"], detached: true });
        let line = "";
        o.stdout.on("data", (d) => (line += d));
        await waitWhile(() => !line.includes("\\n"), 20000, 10);
        const mine = child(w.mark());
        say({ other: JSON.parse(line), mine: mine.pid, watchdog: w.watchdogPid });
        process.kill(process.pid, "SIGKILL");`));
      left.push(seen.other.process, seen.other.child);
      assert.ok(await waitGone(seen.mine, 10000), "the killed process's child outlived it");
      assert.ok(await waitGone(seen.watchdog, 10000), "the killed process's watchdog stayed");
      assert.equal(gone(seen.other.child), false, "the killed process's watchdog took the other plugin process's child");
      assert.equal(gone(seen.other.watchdog), false, "the other plugin process's watchdog ended");
      process.kill(seen.other.process, "SIGKILL");
      assert.ok(await waitGone(seen.other.child, 10000), "the other process's child outlived it, once it was killed");
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  // What a child of the component's worker left running in a group of its own (a CLI's own
  // daemon, the environment kept) once that child was reaped is left alone when the plugin
  // is killed later in the same call, as it is for a child of the plugin's thread: each
  // worker child carries a mark of its own within the call's, taken back as it is reaped.
  // The call's other child, still running, dies. Through the real pool.
  for (const runtime of ["node", "bun"]) test(`${runtime}: what a worker's child left running once reaped is left alone when the plugin is killed mid-call`, async () => {
    const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "boxd-watchdog-daemon-")));
    const noted = (name) => (fs.existsSync(path.join(dir, name)) ? fs.readFileSync(path.join(dir, name), "utf8").trim().split("\n").filter(Boolean).map(Number) : []);
    try {
      // machine list runs in the worker (the batch's first request): it leaves a daemon and
      // answers; snapshots list, on the plugin's thread, hangs.
      fs.writeFileSync(path.join(dir, "boxd"), `#!/bin/sh\nif [ "$1" = machine ]; then setsid sleep 30 & echo $! >> ${dir}/daemon; echo '[]'; exit 0; fi\necho $$ >> ${dir}/hung\nexec sleep 30\n`, { mode: 0o755 });
      runScript(runtime, `
        const dir = ${JSON.stringify(dir)};
        const { pool, status } = await poolIn(dir);
        status();
        const there = (f) => fs.existsSync(dir + "/" + f);
        await waitWhile(() => !(there("daemon") && there("hung")), 30000, 20);
        await new Promise((r) => setTimeout(r, 300)); // the worker's child reaped, and heard of
        say({});
        process.kill(process.pid, "SIGKILL");`);
      const [daemon] = noted("daemon");
      const [hung] = noted("hung");
      left.push(daemon, hung);
      assert.ok(daemon && hung, `the call's two children did not both start (daemon ${daemon}, hung ${hung})`);
      assert.ok(await waitGone(hung, 10000), "the call's child still running outlived the plugin");
      assert.equal(gone(daemon), false, "what the worker's reaped child left running was killed with the plugin");
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  // A plugin disposed with a call in flight (pool.close(), then the watchdog's idle()): the
  // call is answered, its children on both threads are killed, and the watchdog ends once
  // the worker has exited and let go of the call's mark. Through the real pool.
  for (const runtime of ["node", "bun"]) test(`${runtime}: closing the pool mid-call kills the call's children and the watchdog ends`, async () => {
    const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "boxd-watchdog-close-")));
    try {
      fs.writeFileSync(path.join(dir, "boxd"), `#!/bin/sh\necho $$ >> ${dir}/pids\nexec sleep 30\n`, { mode: 0o755 });
      const seen = JSON.parse(runScript(runtime, `
        const dir = ${JSON.stringify(dir)};
        const { pool, status } = await poolIn(dir);
        const answer = status();
        const pids = () => (fs.existsSync(dir + "/pids") ? fs.readFileSync(dir + "/pids", "utf8").trim().split("\\n").map(Number) : []);
        await waitWhile(() => pids().length < 2, 30000, 20);
        const watchdog = w.watchdogPid;
        pool.close();
        w.idle();
        const answered = await Promise.race([answer, new Promise((r) => setTimeout(() => r(null), 10000))]);
        const childrenGone = (await Promise.all(pids().map((pid) => waitGone(pid, 5000)))).every(Boolean);
        const watchdogEnded = await waitGone(watchdog, 10000);
        say({ answered, children: pids(), childrenGone, watchdog, watchdogEnded });
        process.exit(0);`));
      left.push(...(seen.children ?? []));
      assert.equal(seen.children.length, 2, `the call's two children did not both start (${JSON.stringify(seen)})`);
      assert.match(JSON.stringify(seen.answered), /shutting down/, "the call in flight was not answered at close()");
      assert.ok(seen.childrenGone, "a child of the closed pool's call outlived close()");
      assert.ok(seen.watchdog && seen.watchdogEnded, "the watchdog of a disposed plugin stayed after its worker had exited");
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  // A worker's exit closes no descriptor the plugin's thread holds. A worker child's output
  // files, kept after its answer while something it left in its group ran, are handed to
  // the plugin's thread, which closes them once that group is gone (here: killed for writing
  // past the stderr cap, which does not wait on init to reap it); Node, by default,
  // also closed every file a worker had opened when the worker exited, so the numbers,
  // reused meanwhile by the plugin's thread for other files, were closed under it.
  for (const runtime of ["node", "bun"]) test(`${runtime}: a worker's exit closes none of the plugin thread's descriptors`, async () => {
    const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "boxd-watchdog-fds-")));
    try {
      // machine list runs in the worker; what it leaves in its group writes past the cap.
      fs.writeFileSync(path.join(dir, "boxd"), `#!/bin/sh\nif [ "$1" = machine ]; then (sleep 0.3; head -c 2000000 /dev/zero >&2; exec sleep 30) & fi\necho '[]'\n`, { mode: 0o755 });
      const seen = JSON.parse(runScript(runtime, `
        const dir = ${JSON.stringify(dir)};
        const { pool, status } = await poolIn(dir);
        const fds = () => fs.readdirSync("/proc/self/fd").map(Number);
        const before = fds();
        await status();
        // The kept files: output files with something in them (the spare ones are empty).
        const output = (fd) => {
          try {
            return fs.readlinkSync("/proc/self/fd/" + fd).includes(".boxd-bridge-") && fs.fstatSync(fd).size > 0;
          } catch {
            return false;
          }
        };
        const held = fds().filter(output);
        // Its group killed past the cap and its kept files closed by the plugin's thread.
        await waitWhile(() => held.some(output), 10000, 50);
        const freed = held.filter((fd) => !output(fd)).length;
        // Files of the plugin's thread, taking the lowest free numbers: those just closed.
        const victims = Array.from({ length: 16 }, (_, i) => fs.openSync(dir + "/victim" + i, "w"));
        const exited = new Promise((r) => setTimeout(r, 3000));
        pool.close();
        await exited; // the worker has exited
        const closed = victims.filter((fd) => {
          try {
            fs.fstatSync(fd);
            return false;
          } catch {
            return true;
          }
        });
        say({ victims, closed, freed });
        process.exit(0);`));
      assert.ok(seen.victims?.length === 16 && seen.freed >= 1, `the kept files were never let go, so nothing was checked (${JSON.stringify(seen)})`);
      assert.deepEqual(seen.closed, [], `a worker's exit closed descriptors of the plugin's thread (${JSON.stringify(seen)})`);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  // A pool closed while idle leaves no output file open: its workers close their spare
  // output files, which only they know, before they end (they run with trackUnmanagedFds
  // off, so nothing else would). A long-lived OpenCode disposes and makes plugin instances.
  for (const runtime of ["node", "bun"]) test(`${runtime}: closing idle pools leaves no output file open`, async () => {
    const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "boxd-watchdog-spares-")));
    try {
      fs.writeFileSync(path.join(dir, "boxd"), "#!/bin/sh\necho '[]'\n", { mode: 0o755 });
      const seen = JSON.parse(runScript(runtime, `
        const dir = ${JSON.stringify(dir)};
        const open = () => fs.readdirSync("/proc/self/fd").filter((fd) => {
          try {
            return fs.readlinkSync("/proc/self/fd/" + fd).includes(".boxd-bridge-");
          } catch {
            return false;
          }
        }).length;
        const counts = [];
        for (let round = 0; round < 4; round++) {
          const { pool, status } = await poolIn(dir);
          const answer = await status();
          if (!answer.ok) throw new Error(JSON.stringify(answer));
          await new Promise((r) => setTimeout(r, 100)); // the worker's spares made again
          pool.close();
          await new Promise((r) => setTimeout(r, 1500)); // the worker ended
          counts.push(open());
        }
        say({ counts });
        process.exit(0);`));
      assert.equal(seen.counts?.length, 4, JSON.stringify(seen));
      assert.ok(seen.counts[3] <= seen.counts[0], `output files left open grew with each closed pool: ${seen.counts.join(", ")}`);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  // Closed pools leave no thread behind, their workers idle or mid-call: the preview2-shim's
  // I/O thread, which each worker starts, ends once its worker has (lib/shimworker.js). Bun
  // does not end it with its worker (Node does): a thread, its descriptors and ~6 MB were
  // left by each plugin a long-lived OpenCode disposed.
  for (const runtime of ["node", "bun"]) test(`${runtime}: closed pools leave no thread behind, idle or mid-call`, async () => {
    const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "boxd-watchdog-threads-")));
    try {
      // With DIR/slow there, each child notes its pid and hangs: the pool is closed mid-call.
      fs.writeFileSync(path.join(dir, "boxd"), `#!/bin/sh\nif [ -e ${dir}/slow ]; then echo $$ >> ${dir}/pids; exec sleep 30; fi\necho '[]'\n`, { mode: 0o755 });
      const seen = JSON.parse(runScript(runtime, `
        const dir = ${JSON.stringify(dir)};
        // Bun names every worker thread "Worker" and starts helpers of its own lazily, so
        // under Bun only workers are counted; Node's threads are all counted.
        const bun = typeof Bun !== "undefined";
        const comm = (t) => { try { return fs.readFileSync("/proc/self/task/" + t + "/comm", "utf8").trim(); } catch { return ""; } }; // it may have just ended
        const counted = () => fs.readdirSync("/proc/self/task").filter((t) => !bun || comm(t) === "Worker");
        const threads = () => counted().length;
        const pids = () => (fs.existsSync(dir + "/pids") ? fs.readFileSync(dir + "/pids", "utf8").trim().split("\\n").map(Number) : []);
        // What each counted thread is doing, and what became of the children: for the
        // message of a run whose count did not come back.
        const task = (t, f) => { try { return fs.readFileSync("/proc/self/task/" + t + "/" + f, "utf8").trim(); } catch { return "-"; } };
        const doing = () => ({
          threads: counted().map((t) => [t, comm(t), task(t, "stat").split(") ")[1]?.split(" ")[0], task(t, "wchan"), task(t, "children")].join(" ")),
          children: pids().map((p) => p + (gone(p) ? " gone" : " alive")),
        });
        const counts = [];
        for (let round = 0; round < 6; round++) {
          const busy = round % 2 === 1;
          if (busy) fs.writeFileSync(dir + "/slow", "");
          else fs.rmSync(dir + "/slow", { force: true });
          const { pool, status } = await poolIn(dir);
          const answer = status();
          if (busy) {
            const had = pids().length;
            await waitWhile(() => pids().length === had, 30000, 20);
          } else {
            const a = await answer;
            if (!a.ok) throw new Error(JSON.stringify(a));
          }
          pool.close();
          // The first round sets the count (its worker given 1.5 s to end); after each later
          // one, the count comes back down to it once the worker and its I/O thread have ended.
          if (round === 0) await new Promise((r) => setTimeout(r, 1500));
          await waitWhile(() => round && threads() > counts[0], 5000, 50);
          counts.push(threads());
        }
        say({ counts, children: pids(), left: counts.at(-1) > counts[0] ? doing() : undefined });
        process.exit(0);`));
      left.push(...(seen.children ?? []));
      assert.equal(seen.counts?.length, 6, JSON.stringify(seen));
      assert.ok(seen.children.length >= 3, `the pools were not closed mid-call (${JSON.stringify(seen)})`);
      assert.ok(seen.counts.at(-1) <= seen.counts[0], `threads left grew with each closed pool: ${seen.counts.join(", ")} (${JSON.stringify(seen.left)})`);
      for (const pid of seen.children) assert.ok(await waitGone(pid, 5000), `${pid}, a child of a pool closed mid-call, outlived close()`);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  // A plugin killed between an output file's open and its unlink leaves the file named (and
  // empty) in the temporary folder. The next plugin process removes those of processes that
  // are gone, once, and leaves those of a live pid alone.
  for (const runtime of ["node", "bun"]) test(`${runtime}: output files a killed plugin left named are removed, a live process's are not`, async () => {
    const dead = spawnSync("true").pid; // ended and reaped: no process has it now
    const orphan = path.join(os.tmpdir(), `.boxd-bridge-${dead}-0123456789ab.out`);
    const living = path.join(os.tmpdir(), `.boxd-bridge-${process.pid}-0123456789ab.out`);
    for (const f of [orphan, living]) fs.writeFileSync(f, "");
    try {
      runScript(runtime, `
        const outputs = await import(${JSON.stringify(path.join(PLUGIN, "lib/outputs.js"))});
        fs.closeSync(outputs.takeOutputFile());
        await new Promise((r) => setTimeout(r, 300));
        say({});`);
      assert.equal(fs.existsSync(orphan), false, "an output file left by a process that is gone was not removed");
      assert.equal(fs.existsSync(living), true, "an output file of a live process was removed");
    } finally {
      for (const f of [orphan, living]) fs.rmSync(f, { force: true });
    }
  });

  // A child is guarded from its first instant, whichever thread starts it: the plugin's
  // process is killed the moment its component worker has forked a child (seen among the
  // worker thread's children, before or just after its exec), and the child and what it
  // started go with it. Under Node and under Bun, OpenCode's runtime, through the real pool.
  for (const runtime of ["node", "bun"]) test(`${runtime}: a child the component's worker starts dies with a process killed the moment it forked`, async () => {
    const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "boxd-watchdog-fork-")));
    try {
      const pids = path.join(dir, "pids");
      fs.writeFileSync(path.join(dir, "boxd"), `#!/bin/sh\necho $$ >> ${pids}\nsleep 30 &\necho $! >> ${pids}\nsleep 30\n`, { mode: 0o755 });
      const seen = JSON.parse(runScript(runtime, `
        const dir = ${JSON.stringify(dir)};
        const { pool, status } = await poolIn(dir);
        await pool.describe(); // the worker ready: its probe child (lib/inworker.js threadId) has ended
        const watchdogAfterDescribe = w.watchdogPid ?? null; // describe runs no child
        status();
        await null; // the pool posts the call to its worker in a microtask
        // The worker's children, as soon as there is one: no turn of the event loop between.
        const tasks = () => fs.readdirSync("/proc/self/task").filter((t) => Number(t) !== process.pid);
        for (const t = Date.now(); Date.now() - t < 30000; ) {
          for (const tid of tasks()) {
            let kids = "";
            try {
              kids = fs.readFileSync("/proc/self/task/" + tid + "/children", "utf8").trim();
            } catch {}
            if (kids && !kids.split(" ").map(Number).includes(w.watchdogPid)) {
              say({ children: kids.split(" ").map(Number), watchdogAfterDescribe });
              process.kill(process.pid, "SIGKILL");
            }
          }
        }
        say({ children: [] });
        process.kill(process.pid, "SIGKILL");`));
      assert.ok(seen.children.length > 0, "the worker started no child within 30 s");
      assert.equal(seen.watchdogAfterDescribe, null, "a plugin that has only described its tools started a watchdog");
      for (const pid of seen.children) assert.ok(await waitGone(pid, 10000), `${pid}, forked by the worker as its process was killed, outlived it`);
      // Whatever the child got to start once it ran (it notes its pids as it starts them).
      await new Promise((r) => setTimeout(r, 500));
      const noted = fs.existsSync(pids) ? fs.readFileSync(pids, "utf8").trim().split("\n").filter(Boolean).map(Number) : [];
      for (const pid of noted) assert.ok(await waitGone(pid, 10000), `${pid}, started by the killed process's child, outlived it`);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

/**
 * Run `body` as a module under `runtime` (node, or bun: OpenCode's own binary), with
 * lib/watchdog.js as `w`, spawn, harness's gone and waitGone, `waitWhile(cond, ms, step)`,
 * `killWatchdog()`, and
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
    // Wait, polling every \`step\` ms, while \`cond\` holds, for at most \`ms\`, on the monotonic
    // clock (as harness's waitGone: this machine's wall clock can jump).
    const waitWhile = async (cond, ms, step) => {
      const end = performance.now() + ms;
      while (cond() && performance.now() < end) await new Promise((r) => setTimeout(r, step));
    };
    // The real pool over DIR, whose boxd is DIR/boxd (a fake the test wrote): {pool, status},
    // status() one boxd_status call.
    const poolIn = async (dir) => {
      const policy = await import(${JSON.stringify(path.join(PLUGIN, "lib/policy.js"))});
      const { Pool } = await import(${JSON.stringify(path.join(PLUGIN, "lib/pool.js"))});
      fs.mkdirSync(dir + "/proj", { recursive: true });
      const g = policy.resolveGrants({ options: { boxd: dir + "/boxd", ledgerDir: dir + "/ledger" }, directory: dir + "/proj", env: { PATH: process.env.PATH, HOME: dir } });
      const pool = new Pool(g);
      const ctx = () => ({ hostName: "opencode", hostVersion: "1.18.33", optionsJson: "{}", project: g.project, ledger: g.ledger, nowMs: Date.now(), entropy: new Uint8Array(32), approved: true });
      return { pool, status: () => pool.call("boxd_status", "{}", ctx()) };
    };
    // A detached sleep, its environment marked with \`m\` (w.mark()), or not (null).
    const child = (m) => spawn("sleep", ["30"], { detached: true, stdio: "ignore", env: w.marked(m?.env ?? null, { PATH: process.env.PATH }) });
    // SIGKILL the watchdog as someone else would, and wait for the next (at most 10 s); its pid.
    const killWatchdog = async () => {
      const first = w.watchdogPid;
      process.kill(first, "SIGKILL");
      await waitWhile(() => !(w.watchdogPid && w.watchdogPid !== first), 10000, 10);
      return first;
    };
    ${body}`);
  const [bin, env] = runtime === "bun" ? [OPENCODE, { ...process.env, BUN_BE_BUN: "1" }] : [process.execPath, process.env];
  try {
    return execFileSync(bin, [script], { encoding: "utf8", env, timeout: 60000 });
  } catch (e) {
    // A script that ended before it said anything: how, and its last words, not a bare
    // "Unexpected end of JSON input" from the caller's parse.
    if (!e.stdout) throw new Error(`the ${runtime} script ended (${e.signal ?? `exit code ${e.status}`}) without an answer: ${String(e.stderr ?? "").slice(-2000)}`);
    return e.stdout;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
