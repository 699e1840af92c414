// Children die with the plugin's process, even one killed with SIGKILL. boxd-host sets
// PR_SET_PDEATHSIG on each child; Node and Bun have no such thing, and each child leads its
// own process group (so a timeout can kill its grandchildren), so an OpenCode killed
// outright left every boxd call it was running to go on alone: one that hung ran for ever,
// and a slow one landed long after the next call had taken over its work.
//
// One watchdog a process stands in: /bin/sh reading a pipe only this process holds. A
// child's group is announced as it starts ("+ PID START") and taken back once it is
// answered ("- PID START"); when the pipe ends (this process is gone, however it ended)
// the watchdog kills each group still listed whose leader is still that same process (its
// start time in /proc/PID/stat), so a pid used again by someone else is never touched, and
// still running: a child that had exited is left with what it left behind, as ever.
// Linux only (it reads /proc); elsewhere children still outlive a SIGKILL.
import { spawn } from "node:child_process";
import fs from "node:fs";

// `read` and `kill` are builtins: nothing to find on PATH once the laptop is in trouble.
const SCRIPT = `
live=
while read -r op pid start; do
  case $op in
    +) live="$live $pid:$start" ;;
    -) kept=; for g in $live; do [ "$g" = "$pid:$start" ] || kept="$kept $g"; done; live=$kept ;;
  esac
done
for g in $live; do
  pid=\${g%%:*}
  read -r stat 2>/dev/null < /proc/$pid/stat || continue
  set -- \${stat##*) }
  # A leader that has exited (a zombie no one reaped) is left, with what it left behind.
  [ "$1" = Z ] && continue
  shift 19
  [ "$1" = "\${g#*:}" ] && kill -9 -$pid 2>/dev/null
done
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
function watchdog() {
  if (pipe !== undefined) return pipe;
  pipe = null;
  if (!fs.existsSync("/proc/self/stat")) return pipe;
  try {
    // Its own group: a signal to OpenCode's group (a terminal's, a harness's) leaves it
    // standing to do its job.
    const child = spawn("/bin/sh", ["-c", SCRIPT], { stdio: ["pipe", "ignore", "ignore"], detached: true, env: {} });
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
  }
  return pipe;
}

/** The watchdog's pid, once started (tests). */
export let watchdogPid;

// Children announced and not yet taken back; and whether the plugin was disposed, so the
// watchdog ends once the last of them is answered: a disposed plugin leaves no process.
let guarded = 0;
let ending = false;
function endIfIdle() {
  if (!ending || guarded > 0 || !pipe) return;
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
  const start = startTime(pid);
  const to = start === undefined ? null : watchdog();
  if (!to) return () => {};
  const say = (op) => {
    try {
      to.write(`${op} ${pid} ${start}\n`);
    } catch {}
  };
  say("+");
  guarded++;
  ending = false;
  let done = false;
  return () => {
    if (done) return;
    done = true;
    say("-");
    guarded--;
    endIfIdle();
  };
}
