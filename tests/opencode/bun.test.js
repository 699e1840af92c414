// The pool's children under OpenCode's own runtime, Bun (opencode-ai 1.18.33 is a Bun
// binary; `BUN_BE_BUN=1 opencode script.mjs` runs a script in it). The other suites run the
// plugin's code under Node only, and Bun differs where it matters: its spawnSync ignores
// `detached`, so a child run that way shares OpenCode's process group, and killing its
// group kills nothing. Here a real boxd_status call (tests/opencode/bun-pool.mjs) whose
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

/** Run bun-pool.mjs SCENARIO under Bun with `script` as boxd: {answer, pids, ms}. */
function underBun(scenario, script) {
  const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), `boxd-bun-${scenario}-`)));
  dirs.push(dir);
  const pids = path.join(dir, "pids");
  fs.writeFileSync(path.join(dir, "boxd"), script.replaceAll("PIDS", pids), { mode: 0o755 });
  const t0 = performance.now();
  let out;
  try {
    out = execFileSync(OPENCODE, [new URL("./bun-pool.mjs", import.meta.url).pathname, scenario, dir], {
      env: { ...process.env, BUN_BE_BUN: "1" },
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

  test("children die when the plugin's process exits", async () => {
    const { pids } = underBun("exit", HANGING);
    assert.equal(pids.length, 4);
    for (const pid of pids) assert.ok(await waitGone(pid, 3000), `${pid} outlived the plugin's process`);
  });
});
