// A child run by the component's worker itself, with spawnSync, for the requests that need
// no streaming (no stdin, no files): most boxd calls. The worker is blocked on the call
// anyway; running the child there spares each one a worker↔main round trip, the async
// ChildProcess machinery and the fork on the plugin's thread (~0.8 ms a child, measured with
// benches/bridge.mjs). Requests with stdin or files still go to the plugin's thread
// (policy.js runChild), which streams them.
//
// The promises of runChild are kept, the main thread doing what the blocked worker cannot:
// - its own process group (detached), killed as a group on timeout (spawnSync kills the
//   child; the worker kills what is left of the group when it returns, while it is still
//   that group: killLeftGroup);
// - a user abort kills the call's children: the main thread finds them as the children of
//   the worker's thread (/proc/self/task/TID/children: the thread that forked is their
//   parent), and the worker refuses any spawn of an aborted call;
// - output caps: stdout and stderr go to unlinked files (a daemon the child leaves holding
//   them cannot hold the answer), whose sizes the main thread checks every 50 ms through
//   the worker's own descriptors of them, killing the group past a cap;
// - children die with the plugin's process (the main thread's exit handler; the call's
//   mark, announced by the main thread before the call reached this worker, for a
//   SIGKILL: lib/watchdog.js).
// Where /proc/thread-self/children is missing, or the runtime's spawnSync does not give the
// child its own group, every request takes the plugin's thread (threadId below).
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import { holdOutputs, keepOutputs, killLeftGroup, readStart, takeOutputFile } from "./outputs.js";
import { BOUNDS, checkLaunch, overCap } from "./policy.js";
import { marked } from "./watchdog.js";

// The shared words of a worker (Int32Array over a SharedArrayBuffer).
export const REPLY = 0; // raised by the main thread when a spawn reply is on the port
export const ABORTED = 1; // the id of the call the user aborted
export const CAPPED_PID = 2; // a child the main thread killed for its output…
export const CAPPED_STREAM = 3; // …and which stream (1 stdout, 2 stderr)
// The running child's stdout and stderr files: each one's inode (low and high 32 bits)
// and the worker's descriptor of it (0 once the child has been reaped). The watch reads
// the files through these descriptors, not through the child's: a child may point its own
// fd 1 elsewhere and leave a process of its group writing to the file (it filled 1.8 GB of
// /tmp past the 64 MiB cap, unseen), or point fd 1 at its stderr file (`>&2`).
export const STDOUT_FILE = 4;
export const STDERR_FILE = 6;
export const STDOUT_FD = 8;
export const STDERR_FD = 9;
// Raised before each child's files are noted: a watch that saw it unchanged around its look
// at the children looked at that child's files (a descriptor and an inode may both be used
// again by the next child's).
export const NOTED = 10;
export const SHARED_WORDS = 11;

const STREAMS = { 1: "stdout", 2: "stderr" };
const err = (tag, val) => ({ tag: "err", val: val === undefined ? { tag } : { tag, val } });

/**
 * This thread's id when it may run children itself, else undefined (all go to the plugin's
 * thread). It may when a child started here (runSync) leads its own process group and is
 * listed among this thread's children, the two things every kill above relies on; a probe
 * child checks both.
 */
export function threadId() {
  try {
    const tid = fs.readlinkSync("/proc/thread-self").split("/").pop();
    // Shell builtins only: the child's own stat line and this thread's children, as it sees them.
    const probe = 'read -r s < /proc/$$/stat; read -r c < "/proc/$PPID/task/$1/children"; echo "${s##*)}|$c"';
    const r = runSync("/bin/sh", ["-c", probe, "probe", tid], { cwd: "/", env: {}, stdio: ["ignore", "pipe", "ignore"], timeout: 5000 });
    const [stat, children] = String(r.stdout ?? "").split("|");
    const pgrp = Number(stat?.trim().split(" ")[2]);
    if (!(r.pid > 0) || pgrp !== r.pid || !children?.split(" ").map(Number).includes(r.pid)) return undefined;
    return tid;
  } catch {
    return undefined;
  }
}

/** Whether the worker runs this request itself (nothing to stream). */
export function runsInWorker(req) {
  return !req.stdin?.length && !req.stdinFiles?.length && !req.stdoutFiles?.length;
}

/**
 * spawnSync in its own process group ({pid, status, error, stdout}, as Node's spawnSync),
 * killed with SIGKILL past `timeout`. Bun (OpenCode's runtime) ignores `detached` in
 * child_process.spawnSync, so its child would stay in OpenCode's group, where killing "its
 * group" kills nothing and the caps, the abort and the exit handler all miss it; Bun's own
 * Bun.spawnSync honours it.
 */
export function runSync(binary, args, { cwd, env, stdio, timeout }) {
  if (!globalThis.Bun) return spawnSync(binary, args, { cwd, env, stdio, timeout, detached: true, killSignal: "SIGKILL" });
  try {
    const r = Bun.spawnSync({ cmd: [binary, ...args], cwd, env, stdio, timeout, detached: true, killSignal: "SIGKILL" });
    return { pid: r.pid, status: r.exitCode, stdout: r.stdout, error: r.exitedDueToTimeout ? { code: "ETIMEDOUT" } : undefined };
  } catch (e) {
    return { pid: undefined, status: null, error: e }; // it could not start (ENOENT, EACCES…)
  }
}

/**
 * Run one child on this (worker) thread: the WIT spawn.run's answer. `shared` is the
 * worker's shared words; `call` the id of the call asking; `mark` the child's watchdog
 * mark ([name, value] or null, lib/watchdog.js). Hooks: `onGrant(grant)` hears the grant
 * it ran under; `onReaped()` is called as soon as the child has been reaped; `keep(held)`
 * takes the child's output files when something it left in its group may still write
 * into them (lib/outputs.js holdOutputs): the shipped worker hands them to the plugin's
 * thread, which watches them while this thread is blocked in its next call; by default
 * this thread keeps them.
 */
export function runInWorker(req, grants, shared, call, mark, { onGrant = () => {}, keep = keepOutputs, onReaped = () => {} } = {}) {
  if (Atomics.load(shared, ABORTED) === call) return err("failed", "the user aborted this tool call");
  const launch = checkLaunch(req, grants);
  if (launch.refused) return launch.refused;
  onGrant(launch.grant);
  const files = [];
  let group;
  try {
    // One at a time: a second that cannot be made must not leave the first unrecorded.
    files.push(takeOutputFile());
    files.push(takeOutputFile());
    const [out, errOut] = files;
    Atomics.add(shared, NOTED, 1);
    setFile(shared, STDOUT_FILE, STDOUT_FD, out);
    setFile(shared, STDERR_FILE, STDERR_FD, errOut);
    const r = runSync(launch.binary, req.args, {
      cwd: launch.cwd,
      env: marked(mark, launch.env),
      stdio: ["ignore", out, errOut],
      timeout: Math.max(1, req.timeoutMs),
    });
    unsetFiles(shared);
    onReaped(); // before anything else: the watchdog takes its mark back (what it left is left alone)
    group = r.pid;
    if (r.error?.code === "ENOENT") return err("not-found", launch.binary);
    if (r.error && r.error.code !== "ETIMEDOUT") return err("failed", `${launch.binary}: ${r.error.message}`);
    if (r.error) {
      killLeftGroup(r.pid);
      return err("timed-out");
    }
    if (Atomics.load(shared, CAPPED_PID) === r.pid) {
      Atomics.store(shared, CAPPED_PID, 0);
      return overCap(req.program, STREAMS[Atomics.load(shared, CAPPED_STREAM)]);
    }
    // Past a cap only now, after the exit: what the child left in its group is still
    // writing, and is killed as any child past a cap is.
    const stdout = readStart(out, BOUNDS.stdout + 1);
    if (stdout.length > BOUNDS.stdout) {
      killLeftGroup(r.pid);
      return overCap(req.program, "stdout");
    }
    const stderr = readStart(errOut, BOUNDS.stderr + 1);
    if (stderr.length > BOUNDS.stderr) {
      killLeftGroup(r.pid);
      return overCap(req.program, "stderr");
    }
    const exitCode = r.status ?? undefined;
    return { tag: "ok", val: { exitCode, stdout: new Uint8Array(stdout), stderr: new Uint8Array(stderr), files: [] } };
  } catch (e) {
    return err("failed", `${req.program}: ${e.message}`);
  } finally {
    unsetFiles(shared);
    // Kept while the child's group lives (what it left running may write on), checked
    // against the caps by whichever thread `keep` hands them to.
    const held = holdOutputs(group, files.map((fd, i) => [fd, i ? BOUNDS.stderr : BOUNDS.stdout]));
    if (held) keep(held);
  }
}

/** Note the output file `fd` in the shared words: its inode at `at`, then `fd` at `fdAt`. */
function setFile(shared, at, fdAt, fd) {
  const ino = fs.fstatSync(fd, { bigint: true }).ino;
  Atomics.store(shared, at, Number(ino & 0xffffffffn) | 0);
  Atomics.store(shared, at + 1, Number((ino >> 32n) & 0xffffffffn) | 0);
  Atomics.store(shared, fdAt, fd);
}

/** No child runs with the noted files any more (it has been reaped). */
function unsetFiles(shared) {
  Atomics.store(shared, STDOUT_FD, 0);
  Atomics.store(shared, STDERR_FD, 0);
}

/** The file noted for a stream ({fd, ino}), while its child runs. */
function noted(shared, at, fdAt) {
  const fd = Atomics.load(shared, fdAt);
  if (!(fd > 0)) return undefined;
  return { fd, ino: (BigInt(Atomics.load(shared, at + 1) >>> 0) << 32n) | BigInt(Atomics.load(shared, at) >>> 0) };
}

/** The size of the noted file, read through the worker's descriptor (0n if it is not that file). */
function noteSize(file) {
  try {
    const st = fs.fstatSync(file.fd, { bigint: true });
    return st.ino === file.ino ? st.size : 0n;
  } catch {
    return 0n; // closed meanwhile: the child has been reaped
  }
}

// A child still running (listed, not yet reaped), with its group; should it not lead its
// group after all, it dies anyway. Once spawnSync returned, the pid is reaped and may
// already be another process's: what is left of its group is killLeftGroup's.
function killGroup(pid) {
  if (!(pid > 0)) return; // kill(-0) would be our own group: OpenCode's
  try {
    process.kill(-pid, "SIGKILL");
  } catch {}
  try {
    process.kill(pid, "SIGKILL");
  } catch {}
}

/** The children a worker thread is running now (pids). */
export function childrenOf(tid) {
  try {
    return fs.readFileSync(`/proc/self/task/${tid}/children`, "utf8").split(" ").filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/** Kill the process group of every child the worker thread `tid` runs. */
export function killChildrenOf(tid) {
  for (const pid of childrenOf(tid)) killGroup(pid);
}

/**
 * On the main thread, while a call runs in worker thread `tid`: every 50 ms, a child past
 * an output cap is noted in `shared` and its group killed, and once `aborted()` every
 * child is (one started just as the abort came). Returns the stop function.
 */
export function watchOutput(tid, shared, aborted) {
  const timer = setInterval(() => {
    if (aborted()) return killChildrenOf(tid);
    for (const [stream, at, fdAt] of [[1, STDOUT_FILE, STDOUT_FD], [2, STDERR_FILE, STDERR_FD]]) {
      const seen = Atomics.load(shared, NOTED);
      const file = noted(shared, at, fdAt);
      if (!file || noteSize(file) <= BigInt(BOUNDS[STREAMS[stream]])) continue;
      const pids = childrenOf(tid);
      // Still that file's child: the worker notes a new child's files before it starts
      // it, so one listed here while the note stands is the one the file was given to.
      const now = noted(shared, at, fdAt);
      if (Atomics.load(shared, NOTED) !== seen || now?.fd !== file.fd || now.ino !== file.ino) continue;
      for (const pid of pids) {
        Atomics.store(shared, CAPPED_STREAM, stream);
        Atomics.store(shared, CAPPED_PID, pid);
        killGroup(pid);
      }
    }
  }, 50);
  timer.unref?.();
  return () => clearInterval(timer);
}
