// The pool's children under OpenCode's own runtime, Bun (opencode-ai 1.18.33 is a Bun
// binary; `BUN_BE_BUN=1 opencode script.mjs` runs a script in it). Most other suites run
// the plugin's code under Node only (hostkill.test.js runs the watchdog under both), and
// Bun differs where it matters: its child_process.spawnSync ignores `detached`, so a child
// run that way would share OpenCode's process group, where killing its group kills nothing
// (the worker runs children with Bun.spawnSync, lib/inworker.js runSync). Here a real boxd_status call (tests/opencode/bun-pool.mjs) whose
// boxd CLI starts a grandchild and hangs, or floods stdout or stderr, must lose every one of
// them on an abort, at an output cap, on the timeout, and when the plugin's process exits.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { OPENCODE, missingPrerequisite, waitGone } from "./harness.mjs";

const pidsToKill = [];
const dirs = [];
after(() => {
  for (const pid of pidsToKill) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {}
  }
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

/** Run bun-pool.mjs SCENARIO under Bun (or `runtime` node) with `script` as boxd: {answer, pids, ms}. */
function underBun(scenario, script, runtime = "bun") {
  const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), `boxd-bun-${scenario}-`)));
  dirs.push(dir);
  const pids = path.join(dir, "pids");
  fs.writeFileSync(path.join(dir, "boxd"), script.replaceAll("PIDS", pids), { mode: 0o755 });
  const t0 = performance.now();
  let out;
  try {
    const [bin, env] = runtime === "node" ? [process.execPath, process.env] : [OPENCODE, { ...process.env, BUN_BE_BUN: "1" }];
    out = execFileSync(bin, [new URL("./bun-pool.mjs", import.meta.url).pathname, scenario, dir], {
      env,
      encoding: "utf8",
      timeout: 90000,
      stdio: ["ignore", "pipe", "inherit"],
    });
  } finally {
    if (fs.existsSync(pids)) pidsToKill.push(...fs.readFileSync(pids, "utf8").trim().split(/\s+/).map(Number));
  }
  const ms = performance.now() - t0;
  const noted = fs.existsSync(pids) ? fs.readFileSync(pids, "utf8").trim().split(/\s+/).map(Number) : [];
  const line = out.trim().split("\n").pop();
  return { result: line ? JSON.parse(line) : undefined, pids: noted, ms };
}

// Each child notes itself and a grandchild in its group, then waits: a stuck CLI.
const HANGING = "#!/bin/sh\nsleep 300 &\necho $$ $! >> PIDS\nwait\n";

describe("children under Bun, OpenCode's runtime", { skip: missingPrerequisite() ?? false }, () => {
  test("the runtime is Bun", () => {
    const { result } = underBun("capped", "#!/bin/sh\necho '[]'\n");
    assert.match(result.runtime, /^bun /);
  });

  test("an abort kills every child of the call and its grandchildren", async () => {
    const { result, pids } = underBun("abort", HANGING);
    assert.equal(pids.length, 4, "boxd_status ran its two children");
    assert.notEqual(result.answer, "no answer within 30 s", "the aborted call was never answered");
    for (const pid of pids) assert.ok(await waitGone(pid, 3000), `${pid} outlived the abort (${JSON.stringify(result)})`);
  });

  test("the timeout kills every child and its grandchildren", async () => {
    const { result, pids } = underBun("timeout", HANGING);
    assert.equal(pids.length, 4, JSON.stringify(result));
    assert.match(JSON.stringify(result.answer), /timed out|TIMEOUT/i);
    for (const pid of pids) assert.ok(await waitGone(pid, 3000), `${pid} outlived the timeout`);
  });

  test("a child flooding stdout is killed at the 64 MiB cap, with its group", async () => {
    // `yes` in the background keeps the child's stdout: the cap must take the group.
    const { result, pids, ms } = underBun("capped", "#!/bin/sh\nyes 0123456789012345678901234567890123456789 &\necho $$ $! >> PIDS\nwait\n");
    assert.match(JSON.stringify(result.answer), /printed more than 64 MiB on stdout/);
    assert.ok(ms < 30000, `the cap took ${ms} ms to stop a flood (the timeout is 60 s)`);
    for (const pid of pids) assert.ok(await waitGone(pid, 3000), `${pid} outlived the cap`);
  });

  test("a child flooding stderr is killed at the 1 MiB cap, with its group", async () => {
    // stderr is a file, as stdout is: the watch finds the cap passed while `yes` runs on.
    const { result, pids, ms } = underBun("capped", "#!/bin/sh\nyes 0123456789012345678901234567890123456789 >&2 &\necho $$ $! >> PIDS\nwait\n");
    assert.equal(pids.length, 4, "boxd_status ran its two children, each with its writer");
    assert.match(JSON.stringify(result.answer), /printed more than 1 MiB on stderr/);
    assert.ok(ms < 30000, `the cap took ${ms} ms to stop a flood (the timeout is 60 s)`);
    for (const pid of pids) assert.ok(await waitGone(pid, 3000), `${pid} outlived the cap`);
  });

  // What a child the component's worker ran left in its group, writing past the stderr cap
  // after the answer, is killed while the worker is blocked in its next call (6 s here): the
  // plugin's thread watches the files the worker kept. Before, the worker's own timer did,
  // and it could not run until that call ended. Under Bun and Node.
  for (const runtime of ["bun", "node"]) test(`${runtime}: a worker child's leftover writing past a cap is killed while the worker is busy`, async () => {
    const script = [
      "#!/bin/sh",
      'if [ -e "$(dirname PIDS)/slow" ]; then sleep 6; echo "[]"; exit 0; fi',
      // machine list runs in the worker (the batch's first request).
      'if [ "$1" = machine ]; then (sleep 0.3; head -c 2000000 /dev/zero >&2; exec sleep 30) & echo $! >> PIDS; fi',
      'echo "[]"',
    ].join("\n");
    const { result, pids } = underBun("kept", script, runtime);
    assert.match(result.runtime, runtime === "bun" ? /^bun / : /^node$/);
    assert.equal(pids.length, 1, "the first call's worker child left one writer");
    assert.ok(result.answer.goneMs !== null, `the leftover writer was never killed (${JSON.stringify(result.answer)})`);
    assert.ok(result.answer.busy, `the leftover was killed only once the worker's next call had ended, ${result.answer.goneMs} ms after the first answer`);
  });

  test("children die when the plugin's process exits", async () => {
    const { pids } = underBun("exit", HANGING);
    assert.equal(pids.length, 4);
    for (const pid of pids) assert.ok(await waitGone(pid, 3000), `${pid} outlived the plugin's process`);
  });
});
