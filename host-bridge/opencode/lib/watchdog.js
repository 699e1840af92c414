// Children die with the plugin's process, even one killed with SIGKILL. boxd-host sets
// PR_SET_PDEATHSIG on each child; Node and Bun have no such thing, and each child leads its
// own process group (so a timeout can kill its grandchildren), so an OpenCode killed
// outright left every boxd call it was running to go on alone: one that hung ran for ever,
// and a slow one landed long after the next call had taken over its work.
//
// One watchdog a process stands in: /bin/sh reading a pipe only this process holds. Every
// child is started with a mark in its environment, BOXD_BRIDGE_CALL=<token>:<n>; — the
// token drawn once for this process (128 random bits), n a number — or, for a child the
// component's worker runs, <token>:<n>.<k>;, n its call's number and k the child's within
// the call. A mark is announced to the watchdog ("+ n") before any child carries it, and
// taken back ("- n") once every child that carried it has been reaped (a child of the
// plugin's thread: also once its group's SIGKILL is sent past a cap, or 2 s after the one
// sent at a timeout if no exit is heard); a worker's child is taken back alone ("- n.k") as
// soon as the plugin's thread hears it was reaped. When the pipe ends with marks still
// announced (this process is gone, however it ended: an idle plugin ends it with none), the
// watchdog looks through /proc for the leaders of process groups, still running
// and started since this process, whose environment carries one of those marks (anywhere
// in it: a shell the child runs, or a shim, reorders the environment of what it execs),
// and kills each one's group. So a child is guarded from its first instant, whichever
// thread started it (the component's worker runs most children itself, and no thread
// could name their pids before they ran), and a process that is not ours cannot be taken
// for ours: it carries no mark of this process, whatever pid it was given. Nor can a child
// still between its fork and its exec be missed: until its exec it holds this pipe too, so
// the pipe ends only once its environment is the one with the mark.
//
// Left alone: a child that had exited (its group's leader gone), with what it left behind,
// in its group or in one of its own (its mark, or its part of the call's, taken back).
// What a child still running made in a group of its own, keeping the environment, is
// killed with it. Linux only (it reads /proc); elsewhere children still outlive a SIGKILL.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import fs from "node:fs";

/** The environment variable that carries a child's mark. */
export const MARK = "BOXD_BRIDGE_CALL";

// `read`, `set`, `case` and `kill` are builtins: nothing to find on PATH once the laptop is
// in trouble. dash's `read` drops the NULs between the variables of /proc/PID/environ (so
// each line read runs them together; the mark ends with ";"), and stops at a newline.
// $2 is this process's start time (clock ticks since boot, /proc/PID/stat's 22nd field): a
// process that started before it is no child of ours, and its environment is not read
// (dash reads it a byte at a time, ~1 µs a byte).
const SCRIPT = `
token=$1
since=$2
live=
parts=
while read -r op n; do
  case $n in ''|*[!0-9.]*|.*|*.|*.*.*) continue ;; esac
  case $op:$n in
    +:*.*) ;;
    +:*) live="$live $n" ;;
    -:*.*) parts="$parts $n" ;;
    -:*)
      kept=; for m in $live; do [ "$m" = "$n" ] || kept="$kept $m"; done; live=$kept
      kept=; for r in $parts; do [ "\${r%%.*}" = "$n" ] || kept="$kept $r"; done; parts=$kept ;;
  esac
done
[ -n "$live" ] || exit 0
sweep() {
for p in /proc/[0-9]*; do
  pid=\${p#/proc/}
  # Its last line: a process's name may hold a newline.
  stat=
  while read -r line || [ -n "$line" ]; do stat=$line; line=; done 2>/dev/null < $p/stat
  set -- \${stat##*) }
  # A group's leader (its pgrp, the third field after the name, is its pid), not a zombie,
  # started no earlier than this process (the 22nd field).
  [ $# -ge 20 ] && [ "$1" != Z ] && [ "$3" = "$pid" ] && [ "\${20}" -ge "$since" ] || continue
  marks=
  while read -r line 2>/dev/null || [ -n "$line" ]; do
    case $line in *${MARK}=$token:*) marks="$marks$line" ;; esac
    line=
  done 2>/dev/null < $p/environ
  [ -n "$marks" ] || continue
  for m in $live; do
    case $marks in *${MARK}=$token:$m[.\\;]*) ;; *) continue ;; esac
    # A worker's child already reaped: what it left is left alone.
    for r in $parts; do case $marks in *${MARK}=$token:$r\\;*) continue 2 ;; esac; done
    kill -9 -$pid 2>/dev/null
    break
  done
done
}
# Twice: an exec closes the old program's descriptors (this pipe among them) a moment
# before the new environment can be read, so a child exec'ing just as this process died
# can show an empty one; the first look takes longer than that moment.
sweep
sweep
exit 0
`;

const TOKEN = randomBytes(16).toString("hex");

// The watchdog's stdin once started, as {write(line), end()}; null where there is none.
let pipe;
function watchdog() {
  if (pipe !== undefined) return pipe;
  pipe = null;
  if (!fs.existsSync("/proc/self/environ")) return pipe;
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
const ARGV = () => ["-c", SCRIPT, "boxd-watchdog", TOKEN, String(startTime())];

// This process's start time, in clock ticks since boot; 0 (every process looked at) where
// it cannot be read.
function startTime() {
  try {
    const stat = fs.readFileSync("/proc/self/stat", "utf8");
    return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19]) || 0;
  } catch {
    return 0;
  }
}

// Node writes to a child's stdin at once when nothing is queued before it (libuv tries the
// write before queueing it), so a line is in the pipe when write() returns.
function startUnderNode() {
  const child = spawn("/bin/sh", ARGV(), { stdio: ["pipe", "ignore", "ignore"], detached: true, env: {} });
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
// a mark announced while the plugin's thread was busy (starting the call's child) was not
// in the pipe when a SIGKILL came, and the child outlived OpenCode. Bun.spawn's stdin is a
// FileSink, whose flush() writes what it holds before returning.
function startUnderBun() {
  const child = Bun.spawn({ cmd: ["/bin/sh", ...ARGV()], stdin: "pipe", stdout: "ignore", stderr: "ignore", detached: true, env: {} });
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
// failure): the next one is started at once and told every mark still announced, and the
// parts of them already taken back. `next`
// null: none can be started, and none is tried again; nor after REPLACEMENTS, so one that
// cannot live does not make a process of every turn.
const REPLACEMENTS = 10;
let replaced = 0;
function lost(self, next = undefined) {
  if (pipe !== self) return; // ended by idle(), or already replaced
  pipe = next === undefined && replaced >= REPLACEMENTS ? null : next;
  watchdogPid = undefined;
  if (pipe !== undefined || live.size === 0) return;
  replaced++;
  watchdog();
  for (const n of live) {
    tell(`+ ${n}\n`);
    for (const k of parts.get(n) ?? []) tell(`- ${n}.${k}\n`);
  }
}

// A line to the watchdog running as it is written. Never throws: a watchdog gone is heard
// of through its exit.
function tell(line) {
  try {
    watchdog()?.write(line);
  } catch {}
}

/** The watchdog's pid, once started (tests). */
export let watchdogPid;

// Marks announced and not yet taken back; and whether the plugin was disposed, so the
// watchdog ends once the last of them is: a disposed plugin leaves no process.
const live = new Set();
const parts = new Map(); // mark → the parts of it taken back (a worker's children reaped)
let made = 0;
let ending = false;
function endIfIdle() {
  if (!ending || live.size > 0 || !pipe) return;
  try {
    pipe.end(); // EOF with nothing announced: the watchdog kills nothing and exits
  } catch {}
  pipe = undefined; // the next mark starts another
  watchdogPid = undefined;
}

/** The plugin was disposed: end the watchdog once no mark is announced. */
export function idle() {
  ending = true;
  endIfIdle();
}

/**
 * A new mark, announced: `env` is the [name, value] pair to put in the environment of
 * every child it guards, `release()` takes it back once they have all been reaped (what
 * they left running is then left alone). `parts` is the pair's stem for a worker's
 * children (partOf), `releasePart(k)` takes back its child k alone once reaped. Where no
 * watchdog can run, `env` and `parts` are null.
 */
export function mark() {
  if (!watchdog()) return { env: null, parts: null, release: () => {}, releasePart: () => {} };
  const n = ++made;
  live.add(n);
  ending = false;
  tell(`+ ${n}\n`);
  let done = false;
  return {
    env: [MARK, `${TOKEN}:${n};`],
    parts: [MARK, `${TOKEN}:${n}`],
    releasePart: (k) => {
      if (done || !Number.isInteger(k) || k < 1) return;
      if (!parts.has(n)) parts.set(n, new Set());
      parts.get(n).add(k);
      tell(`- ${n}.${k}\n`);
    },
    release: () => {
      if (done) return;
      done = true;
      live.delete(n);
      parts.delete(n);
      tell(`- ${n}\n`);
      endIfIdle();
    },
  };
}

/** The mark pair of child `k` (1, 2, …) of a mark's `parts` stem, or null for none. */
export function partOf(parts, k) {
  return parts ? [parts[0], `${parts[1]}.${k};`] : null;
}

/** `env` with the mark `pair` ([name, value], or null for none) added, as its first variable. */
export function marked(pair, env) {
  if (!pair) return env;
  const [name, value] = pair;
  return { [name]: value, ...env, [name]: value };
}
