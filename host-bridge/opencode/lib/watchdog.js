// Children die with the plugin's process, even one killed with SIGKILL. boxd-host sets
// PR_SET_PDEATHSIG on each child; Node and Bun have no such thing, and each child leads its
// own process group (so a timeout can kill its grandchildren), so an OpenCode killed
// outright left every boxd call it was running to go on alone: one that hung ran for ever,
// and a slow one landed long after the next call had taken over its work.
//
// One watchdog a process stands in: /bin/sh waiting on a pipe only this process holds. The
// children it guards are listed in a file of its own (owner-only, in the temp folder),
// rewritten as each child starts ("PID START") and as it is answered (taken off), so the
// watchdog is never woken while the plugin lives: a child costs two small synchronous
// writes, where a line down the pipe for each start and end woke the shell twice a child
// and cost the bridge ~0.3 ms a child under Bun. When the pipe ends (this process is gone,
// however it ended, or the plugin was disposed with nothing listed) the watchdog kills each
// group still listed whose leader is still that same process (its start time in
// /proc/PID/stat), so a pid used again by someone else is never touched, and still
// running: a child that had exited is left with what it left behind, as ever. Every line
// has the same length, so a rewrite cut short by a kill (before its truncate) leaves whole
// lines of children already answered, which that check skips. Linux only (it reads /proc); elsewhere children still outlive a SIGKILL.
import { spawn } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

// `read`, `kill` and `:` are builtins: nothing to find on PATH once the laptop is in
// trouble (only the list's removal at the end names /bin/rm).
const SCRIPT = `
list=$1
while read -r _; do :; done
while read -r pid start; do
  case $pid in ''|*[!0-9]*) continue ;; esac
  read -r stat 2>/dev/null < /proc/$pid/stat || continue
  set -- \${stat##*) }
  # A leader that has exited (a zombie no one reaped) is left, with what it left behind.
  [ "$1" = Z ] && continue
  shift 19
  [ "$1" = "$start" ] && kill -9 -$pid 2>/dev/null
done < "$list"
/bin/rm -f "$list"
exit 0
`;

/** The start time of process `pid` (field 22 of /proc/PID/stat), or undefined. */
export function startTime(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
  } catch {
    return undefined;
  }
}

let pipe; // the watchdog's stdin, once started; null where there is none
let list; // { path, fd } of the file naming the children guarded
function watchdog() {
  if (pipe !== undefined) return pipe;
  pipe = null;
  if (!fs.existsSync("/proc/self/stat")) return pipe;
  try {
    const at = path.join(os.tmpdir(), `boxd-watchdog-${process.pid}-${crypto.randomBytes(6).toString("hex")}`);
    list = { path: at, fd: fs.openSync(at, fs.constants.O_RDWR | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW, 0o600) };
    // Its own group: a signal to OpenCode's group (a terminal's, a harness's) leaves it
    // standing to do its job.
    const child = spawn("/bin/sh", ["-c", SCRIPT, "boxd-watchdog", at], { stdio: ["pipe", "ignore", "ignore"], detached: true, env: {} });
    child.on("error", () => (pipe = null));
    child.stdin.on("error", () => (pipe = null));
    // Neither keeps the plugin's process alive: it ends when it would have ended anyway.
    child.unref();
    child.stdin.unref?.();
    child.stdin._handle?.unref?.();
    pipe = child.stdin;
    watchdogPid = child.pid;
  } catch {
    pipe = null;
    if (list) {
      try {
        fs.closeSync(list.fd);
        fs.unlinkSync(list.path);
      } catch {}
      list = undefined;
    }
  }
  return pipe;
}

/** The watchdog's pid, once started (tests). */
export let watchdogPid;

// Children guarded and not yet answered (pid → start time), children started and not yet
// listed, and whether the plugin was disposed, so the watchdog ends once the last of them
// is answered: a disposed plugin leaves no process.
const live = new Map();
let waiting = 0;
let ending = false;

/** Write the list of children guarded over the watchdog's file, in place. */
function writeList() {
  if (!list) return;
  const text = Buffer.from([...live].map(([pid, start]) => `${String(pid).padStart(10)} ${String(start).padStart(20)}\n`).join(""));
  try {
    fs.writeSync(list.fd, text, 0, text.length, 0);
    fs.ftruncateSync(list.fd, text.length);
  } catch {}
}

function endIfIdle() {
  if (!ending || live.size > 0 || waiting > 0 || !pipe) return;
  try {
    pipe.end(); // EOF with nothing listed: the watchdog kills nothing, removes the list, exits
  } catch {}
  try {
    fs.closeSync(list.fd);
  } catch {}
  pipe = undefined; // the next child starts another
  list = undefined;
  watchdogPid = undefined;
}

/** The plugin was disposed: end the watchdog once no child of this process is guarded. */
export function idle() {
  ending = true;
  endIfIdle();
}

/** How long after its start a child is listed (see `guard`). */
export const GUARD_AFTER_MS = 10;

/**
 * Have child `pid` (the leader of its own group) killed with its group should this process
 * die before it is answered. Returns the function that takes that back.
 *
 * It is listed GUARD_AFTER_MS after its start, not at once: a read of /proc/PID/stat
 * waits while that process execs, which held the plugin's thread ~0.3 ms a child (the
 * bridge's boxd_status under Bun 1.32-1.46x its two calls, against 1.16-1.19x with no
 * watchdog), and a child answered by then needs no guard. Its pid is not another's before
 * it is answered (it is ours to reap), so the start time read then is still its own.
 */
export function guard(pid) {
  // waiting → listed (or unlisted: gone by then, or no watchdog) → answered
  let state = "waiting";
  waiting++;
  ending = false;
  const timer = setTimeout(() => {
    waiting--;
    const start = startTime(pid);
    state = start !== undefined && watchdog() ? "listed" : "unlisted";
    if (state !== "listed") return endIfIdle();
    live.set(pid, start);
    writeList();
  }, GUARD_AFTER_MS);
  timer.unref?.();
  return () => {
    const was = state;
    state = "answered";
    if (was === "waiting") {
      clearTimeout(timer);
      waiting--;
    } else if (was === "listed") {
      live.delete(pid);
      writeList();
    }
    if (was !== "answered") endIfIdle();
  };
}
