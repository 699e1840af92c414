// Children die with the plugin's process, even one killed with SIGKILL. boxd-host sets
// PR_SET_PDEATHSIG on each child; Node and Bun have no such thing, and each child leads its
// own process group (so a timeout can kill its grandchildren), so an OpenCode killed
// outright left every boxd call it was running to go on alone: one that hung ran for ever,
// and a slow one landed long after the next call had taken over its work.
//
// One watchdog a process stands in: /bin/sh reading a pipe only this process holds. A
// child's group is announced as it starts ("+ PID") and taken back once it has exited
// ("- PID"). The watchdog notes when each line arrives, from the boot clock
// (/proc/uptime, in the clock ticks /proc counts a process's start time in). Neither the
// plugin nor the watchdog reads the child's own /proc/PID/stat then: that read waits while
// the child is still in its exec, which held the plugin's thread ~0.3 ms a child, and dash
// reads that line a byte at a time, ~0.2 ms of the watchdog's time a child on the cores
// the call's children start on (docs/performance.md). The pid is the plugin's child until
// the plugin reaps it, and the "-" written after that follows in the pipe, so a pid
// already used again when its "+" is read (a line read only after the reap) is taken back
// with it, unless the plugin dies in the instant between that reap and that write
// (lib/policy.js writes it as the child's exit is heard; lib/inworker.js at its next look,
// within 50 ms). When the pipe ends (this process is gone, however it ended) the watchdog
// kills each group still listed whose leader is still running and started no later than
// its "+" was read: the child announced, never a process given its pid after that (pids
// are handed out in turn, so such a process starts a whole round of pids later, not
// within the same tick of 10 ms). A child that had exited is left with what it left
// behind, as ever. Where the clock does not agree with /proc (the watchdog's own start
// time, read against it, must be at most 250 ms behind), each child's own start time is
// read at its "+" instead, and only that same process is killed. A line that does not
// name a pid is passed over. Linux only (it reads /proc); elsewhere children still
// outlive a SIGKILL.
import { spawn } from "node:child_process";
import fs from "node:fs";

// `read`, `set`, `shift` and `kill` are builtins: nothing to find on PATH once the laptop
// is in trouble.
const SCRIPT = `
now() { read -r up 2>/dev/null < /proc/uptime || return 1; up=\${up%% *}; c=\${up#*.}; at=$((\${up%.*} * 100 + \${c#0})); }
started() { read -r stat 2>/dev/null < /proc/$1/stat || return 1; set -- \${stat##*) }; [ $# -ge 20 ] || return 1; state=$1; shift 19; at=$1; }
clock=
now && mine=$at && started $$ && [ $((mine - at)) -ge 0 ] && [ $((mine - at)) -lt 25 ] && clock=1
live=
while read -r op pid; do
  case $pid in ''|*[!0-9]*) continue ;; esac
  case $op in
    +) if [ -n "$clock" ]; then now; else started "$pid"; fi && live="$live $pid:$at" ;;
    -) kept=; for g in $live; do [ "\${g%%:*}" = "$pid" ] || kept="$kept $g"; done; live=$kept ;;
  esac
done
for g in $live; do
  pid=\${g%%:*}
  started "$pid" || continue
  # A leader that has exited (a zombie no one reaped) is left, with what it left behind.
  [ "$state" = Z ] && continue
  [ "$at" -le "\${g#*:}" ] && kill -9 -$pid 2>/dev/null
done
exit 0
`;

// The watchdog's stdin once started, as {write(line), end()}; null where there is none.
let pipe;
function watchdog() {
  if (pipe !== undefined) return pipe;
  pipe = null;
  if (!fs.existsSync("/proc/self/stat")) return pipe;
  try {
    pipe = globalThis.Bun ? startUnderBun() : startUnderNode();
  } catch {
    pipe = null;
  }
  return pipe;
}

// Each watchdog runs in its own group: a signal to OpenCode's group (a terminal's, a
// harness's) leaves it standing to do its job. Neither it nor its stdin keeps the plugin's
// process alive: it ends when it would have ended anyway.

// Node writes to a child's stdin at once when nothing is queued before it (libuv tries the
// write before queueing it), so a line is in the pipe when write() returns.
function startUnderNode() {
  const child = spawn("/bin/sh", ["-c", SCRIPT], { stdio: ["pipe", "ignore", "ignore"], detached: true, env: {} });
  const self = { write: (line) => child.stdin.write(line), end: () => child.stdin.end() };
  child.on("error", () => lost(self, null)); // it could not start: none from now on
  child.on("exit", () => lost(self));
  child.stdin.on("error", () => {}); // a write to a watchdog gone: its exit says so
  child.unref();
  child.stdin.unref?.();
  child.stdin._handle?.unref?.();
  watchdogPid = child.pid;
  return self;
}

// Bun's child_process leaves a write to a child's stdin for the next turn of the event loop:
// a child announced while the plugin's thread was busy (starting the call's next child)
// was not in the pipe when a SIGKILL came, and outlived OpenCode. Bun.spawn's stdin is a
// FileSink, whose flush() writes what it holds before returning.
function startUnderBun() {
  const child = Bun.spawn({ cmd: ["/bin/sh", "-c", SCRIPT], stdin: "pipe", stdout: "ignore", stderr: "ignore", detached: true, env: {} });
  const settled = (r) => r?.catch?.(() => {}); // a write to a watchdog gone: its exit says so
  const self = {
    write: (line) => {
      child.stdin.write(line);
      settled(child.stdin.flush());
    },
    end: () => settled(child.stdin.end()),
  };
  child.exited.then(() => lost(self));
  child.unref();
  child.stdin.unref?.();
  watchdogPid = child.pid;
  return self;
}

// A watchdog that ended while it was still this process's (killed by someone, or a
// failure): the next one is started at once and told every child still guarded that is
// still this process's child (ours). `next` null: none can be started, and none is tried
// again; nor after REPLACEMENTS, so one that cannot live does not make a process of every
// turn.
const REPLACEMENTS = 10;
let replaced = 0;
function lost(self, next = undefined) {
  if (pipe !== self) return; // ended by idle(), or already replaced
  pipe = next === undefined && replaced >= REPLACEMENTS ? null : next;
  watchdogPid = undefined;
  if (pipe !== undefined || guarded.size === 0) return;
  replaced++;
  watchdog();
  for (const pid of guarded.keys()) if (ours(pid)) tell(`+ ${pid}\n`);
}

// Whether `pid` is still this process's child. A child may be taken back a moment after it
// was reaped (lib/inworker.js looks every 50 ms), and its pid may be another process's by
// then: the first watchdog noted a moment before that stranger started, so it is never
// matched, but a new watchdog would note a moment after.
function ours(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]) === process.pid;
  } catch {
    return false;
  }
}

// A line to the watchdog running as it is written: one started after the first ended was
// told of the children still guarded (lost), and takes their "-" too. Never throws: a
// watchdog gone is heard of through its exit.
function tell(line) {
  try {
    watchdog()?.write(line);
  } catch {}
}

/** The watchdog's pid, once started (tests). */
export let watchdogPid;

// Children announced and not yet taken back (pid → how many guards); and whether the plugin
// was disposed, so the watchdog ends once the last of them is answered: a disposed plugin
// leaves no process.
const guarded = new Map();
let ending = false;
function endIfIdle() {
  if (!ending || guarded.size > 0 || !pipe) return;
  try {
    pipe.end(); // EOF with nothing listed: the watchdog kills nothing and exits
  } catch {}
  pipe = undefined; // the next child starts another
  watchdogPid = undefined;
}

/** The plugin was disposed: end the watchdog once no child of this process is guarded. */
export function idle() {
  ending = true;
  endIfIdle();
}

/**
 * Have child `pid` (the leader of its own group) killed with its group should this process
 * die before it is answered. Returns the function that takes that back.
 */
export function guard(pid) {
  if (!watchdog()) return () => {};
  tell(`+ ${pid}\n`);
  guarded.set(pid, (guarded.get(pid) ?? 0) + 1);
  ending = false;
  let done = false;
  return () => {
    if (done) return;
    done = true;
    const left = guarded.get(pid) - 1;
    if (left > 0) guarded.set(pid, left);
    else guarded.delete(pid);
    if (!left) tell(`- ${pid}\n`);
    endIfIdle();
  };
}
