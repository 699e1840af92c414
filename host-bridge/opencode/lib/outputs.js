// The files a child's output goes to: unlinked, owner-only temporary files, a few made
// ahead so that making one is not on the spawn path (lib/policy.js runChild and
// lib/inworker.js both take theirs here), closed once the child is answered, or kept
// under watch while something it left in its group may still write (releaseOutputs).
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

/** What every output file's name holds: whose it is (the sweep of a gone process's files; tests find them by it). */
export const OUTPUT_FILE_MARK = `.boxd-bridge-${process.pid}-`;

/** A fresh unlinked, owner-only temporary file for a child's output; its descriptor. */
function makeOutputFile() {
  if (!swept) {
    swept = true;
    setImmediate(() => sweepOrphans(os.tmpdir()));
  }
  const tmp = path.join(os.tmpdir(), `${OUTPUT_FILE_MARK}${randomBytes(6).toString("hex")}.out`);
  const fd = fs.openSync(tmp, "wx+", 0o600);
  fs.unlinkSync(tmp);
  return fd;
}

// A process killed between a file's open and its unlink (above) leaves it there, named and
// empty. Once a process, off the spawn path, the files of processes that are gone are
// removed: the name says whose (a pid still in use keeps its files, ours or not), and
// /tmp's sticky bit leaves another user's alone.
let swept = false;
function sweepOrphans(dir) {
  let names = [];
  try {
    names = fs.readdirSync(dir);
  } catch {}
  for (const name of names) {
    const m = /^\.boxd-bridge-(\d+)-[0-9a-f]{12}\.out$/.exec(name);
    if (!m || Number(m[1]) === process.pid || pidTaken(Number(m[1]))) continue;
    try {
      fs.unlinkSync(path.join(dir, name));
    } catch {}
  }
}

// Output files made ahead, between calls: making one costs ~0.2 ms, which would otherwise
// sit between the component's request and its child's start. A boxd_status in a worker
// takes four (two children, stdout and stderr each). Never shared: each child takes its
// own, and the spares are made again once the thread is free.
const SPARE_OUTPUTS = 4;
const spareOutputs = [];
let refilling = false;
let closed = false;
export function takeOutputFile() {
  const fd = spareOutputs.pop() ?? makeOutputFile();
  if (!refilling && !closed) {
    refilling = true;
    setImmediate(() => {
      refilling = false;
      if (closed) return;
      try {
        while (spareOutputs.length < SPARE_OUTPUTS) spareOutputs.push(makeOutputFile());
      } catch {} // the next child makes its own, and reports the failure
    });
  }
  return fd;
}

/** Close the spare output files, and make no more (a worker about to end). */
export function closeSpareOutputs() {
  closed = true;
  closeAll(spareOutputs.splice(0).map((fd) => [fd]));
}

/** Up to `limit` bytes from the start of the file `fd`. */
export function readStart(fd, limit) {
  let size = 0;
  try {
    size = Math.min(fs.fstatSync(fd).size, limit);
  } catch {}
  const buf = Buffer.alloc(size);
  let off = 0;
  while (off < size) {
    const n = fs.readSync(fd, buf, off, size - off, off);
    if (n === 0) break;
    off += n;
  }
  return buf.subarray(0, off);
}

/** The size of the file `fd`, 0 when it cannot be read. */
export function sizeOf(fd) {
  try {
    return fs.fstatSync(fd).size;
  } catch {
    return 0;
  }
}

// Output files of answered children whose process group still had members: something the
// child left running may write on into them, unseen (they have no name) and, unwatched,
// without bound. Looked at every 50 ms while the group lives, as a running child's are:
// one past its cap has the group killed, as a cap found at the answer has. A process that
// left the group (setsid) is not the host's to kill, and its writes are not bounded here.
// At most HELD_GROUPS are kept (two descriptors each): a CLI that leaves a long-lived
// process behind on every call must not run the plugin out of descriptors. Past that the
// oldest group is killed as its files are let go (while it is still the child's:
// stillOurs): unwatched, what it writes would have no bound (and one silent until then may
// write later). Nor is a group bounded once none of the processes in it at the answer is
// left (one that forked and exited: what it started may be watched no longer), as a
// process that left it is not.
export const HELD_GROUPS = 64;
const SWEEP_MS = 50;
const leftBehind = new Set();
let sweeping;

// Whether process `pid` exists (ours to signal or not).
function pidTaken(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return e?.code === "EPERM";
  }
}

// Whether process group `group`, led by a child just reaped, still has members and is still
// that child's group: no process has the child's pid. Only the process holding a pid can
// make a group of that id, and the kernel hands out no pid still in use as a group id: so
// for a stranger's group to carry this id, ours must have emptied and the pid gone to that
// stranger, who holds it still unless it has exited too. For a moment after the reap this
// is enough; a group kept for longer is checked by its members (stillOurs).
function groupLives(group) {
  if (!(group > 0)) return false; // kill(-0) would be our own group
  try {
    process.kill(-group, 0);
  } catch {
    return false; // the usual answer, asked first: one failed call for a child that left nothing
  }
  return !pidTaken(group);
}

/** SIGKILL what is left of the process group of `group`, a child just reaped (only while
 * it is still that group: groupLives). */
export function killLeftGroup(group) {
  if (!groupLives(group)) return;
  try {
    process.kill(-group, "SIGKILL");
  } catch {}
}

// The processes in process group `group` now, each as "pid start" (its start time, in
// clock ticks since boot, from /proc): the same process only ever reads the same.
function membersOf(group) {
  const members = [];
  let names = [];
  try {
    names = fs.readdirSync("/proc");
  } catch {}
  for (const name of names) {
    if (!/^\d+$/.test(name)) continue; // pids only
    let stat;
    try {
      stat = fs.readFileSync(`/proc/${name}/stat`, "latin1");
    } catch {
      continue;
    }
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    if (Number(f[2]) === group && f[0] !== "Z") members.push(`${name} ${f[19]}`);
  }
  return members;
}

// Whether a kept group is still the one its child left: one of the processes in it at the
// answer still is. The group can become another's only once it has emptied (above), so
// while one of those is in it, every member is what the child left or started since. When
// none is (they left or ended, and what is there came later), it is not killed but let go.
function stillOurs(held) {
  if (!groupLives(held.group)) return false;
  const now = new Set(membersOf(held.group));
  return held.members.some((m) => now.has(m));
}

// A kept group's files closed, and the group killed first when `kill` and still ours.
function letGo(held, kill) {
  leftBehind.delete(held);
  if (kill && stillOurs(held)) {
    try {
      process.kill(-held.group, "SIGKILL");
    } catch {}
  }
  closeAll(held.files);
}

function sweep() {
  for (const held of leftBehind) {
    if (!groupLives(held.group)) letGo(held, false);
    else if (held.files.some(([fd, cap]) => sizeOf(fd) > cap)) letGo(held, true);
  }
  if (leftBehind.size === 0) {
    clearInterval(sweeping);
    sweeping = undefined;
  }
}

function closeAll(files) {
  for (const [fd] of files) {
    try {
      fs.closeSync(fd);
    } catch {}
  }
}

/**
 * A child was answered and reaped: close its output files (`[fd, cap]` pairs), or, while
 * its process group `group` still has members, keep them under the sweep above.
 */
export function releaseOutputs(group, files) {
  const held = holdOutputs(group, files);
  if (held) keepOutputs(held);
}

/**
 * releaseOutputs's first half, on the thread that reaped the child: its output files
 * closed (null), or what keepOutputs needs to keep them ({group, files, members}, plain
 * data: a worker hands it to the plugin's thread, whose sweep runs while the worker is
 * blocked in its next call; descriptors are the process's, whichever thread holds them, as
 * long as Node is not told to close a worker's at its exit: lib/pool.js).
 */
export function holdOutputs(group, files) {
  // Who is in it now, while it is certainly the child's, to know it later (stillOurs); on
  // the answer's path, so only for a child that left something in its group: a look
  // through /proc takes ~50 µs a process here. Nothing is kept where /proc cannot tell.
  const members = groupLives(group) ? membersOf(group) : [];
  if (members.length) return { group, files, members };
  closeAll(files);
  return null;
}

/** Keep a child's output files under the sweep above (`held` from holdOutputs). */
export function keepOutputs(held) {
  for (const kept of leftBehind) {
    if (leftBehind.size < HELD_GROUPS) break;
    letGo(kept, true);
  }
  leftBehind.add(held);
  if (!sweeping) {
    sweeping = setInterval(sweep, SWEEP_MS);
    sweeping.unref?.();
  }
}
