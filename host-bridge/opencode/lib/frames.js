// The files a spawn streams (WIT spawn.request stdin-files / stdout-files), as
// host-bridge/src/runtime/frames.rs does: file bytes go between laptop files and a child's
// pipes as frames, `<size>\n<size bytes><sha256 hex>\n` (docs/guest.md, "Frames"), never
// through the component. The sender hashes while it streams; the receiver hashes again.
// The checks are the component's, made again here: absolute paths inside a preopen with
// no symlink on the way, regular files only, the protocol's limits (dist/protocol.json,
// a copy of component/guest/protocol.json). Memory stays one chunk whatever the size.
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";

const CHUNK = 64 * 1024;
const HEADER_MAX = 21;

let limits;
/** {file, call}: the protocol's caps in bytes. */
export function fileLimits() {
  if (!limits) {
    const doc = JSON.parse(fs.readFileSync(new URL("../dist/protocol.json", import.meta.url), "utf8"));
    limits = { file: doc.limits.file.max, call: doc.limits.call.max };
  }
  return limits;
}

/** How much more than its cap a child's stdout may hold when it frames `n` files. */
export const stdoutAllowance = (n) => (n ? fileLimits().call + n * (HEADER_MAX + 65) : 0);

function confined(p, preopens, what) {
  let real;
  try {
    real = fs.realpathSync(p);
  } catch (e) {
    throw new Error(`${p} cannot be streamed: ${e.message}`);
  }
  if (real !== p) throw new Error(`${p} cannot be streamed: a symlink is on the way, or the path is not clean`);
  if (!preopens.some((o) => real === o || real.startsWith(o.endsWith("/") ? o : `${o}/`))) {
    throw new Error(`${p} cannot be streamed: the ${what} is outside the preopened folders`);
  }
}

/**
 * After an open by path, that the descriptor is the file `p` names now and `p` is still
 * clean and inside a preopen. Node has no openat2 (the Rust host resolves the open beneath
 * its preopen in one call), so a folder swapped for a symlink between the check and the
 * open is caught here instead: `fd` is closed and, when this open `created` the file, the
 * file is removed wherever it landed, before any byte is written to it or read from it.
 */
function openedWhereChecked(fd, p, preopens, what, created) {
  let same = false;
  try {
    confined(p, preopens, what);
    const [opened, named] = [fs.fstatSync(fd), fs.lstatSync(p)];
    same = opened.dev === named.dev && opened.ino === named.ino;
  } catch {}
  if (same) return;
  if (created) {
    try {
      const landed = fs.readlinkSync(`/proc/self/fd/${fd}`);
      const [opened, there] = [fs.fstatSync(fd), fs.lstatSync(landed)];
      if (opened.dev === there.dev && opened.ino === there.ino) fs.unlinkSync(landed);
    } catch {}
  }
  try {
    fs.closeSync(fd);
  } catch {}
  // A file to send is refused in the Rust host's words ("cannot be streamed"), which the
  // component takes as the host's word that the child never started.
  throw new Error(`${p}${created ? "" : " cannot be streamed"}: a symlink is on the way, or it leads out of its preopened folder`);
}

/** Open and check every file sent on stdin before the child starts: [{path, fd, size}]. */
export function openOutgoing(paths, preopens) {
  const { file: fileMax, call: callMax } = fileLimits();
  const out = [];
  let total = 0;
  try {
    for (const p of paths) {
      confined(p, preopens, "file");
      // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
      let fd;
      try {
        fd = fs.openSync(p, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK);
      } catch (e) {
        // Gone since the check, or a symlink now (ELOOP): the Rust host's words for it.
        const why = e.code === "ELOOP" ? "a symlink is on the way, or it leads out of its preopened folder" : e.message;
        throw new Error(`${p} cannot be streamed: ${why}`);
      }
      openedWhereChecked(fd, p, preopens, "file", false);
      out.push({ path: p, fd, size: 0 });
      const st = fs.fstatSync(fd, { bigint: true });
      if (!st.isFile()) throw new Error(`${p} cannot be streamed: it is not a regular file`);
      if (st.size > fileMax) throw new Error(`FILE_TOO_LARGE: ${p} is ${st.size} bytes; the cap is ${fileMax} bytes a file (protocol.json)`);
      total += Number(st.size);
      if (total > callMax) throw new Error(`FILE_TOO_LARGE: the files add up to more than ${callMax} bytes (protocol.json), at ${p}`);
      out[out.length - 1].size = Number(st.size);
      out[out.length - 1].seen = seen(st);
    }
  } catch (e) {
    closeAll(out);
    throw e;
  }
  return out;
}

/** The words a stream stopped for a file that changed under it carries (the component
 * looks for them: component/src/tools/submit.rs CHANGED_MARK; frames.rs CHANGED). */
export const CHANGED = "changed while it was sent";

/** What tells a file rewritten in place: size, mtime and ctime, to the nanosecond. */
const seen = (st) => `${st.size}:${st.mtimeNs}:${st.ctimeNs}`;

class Changed extends Error {}
const changed = (p) =>
  new Changed(`${p} ${CHANGED} (its size, mtime or ctime is not what it was when it was opened), so its frame was cut before its digest`);

export function closeAll(files) {
  for (const f of files) {
    try {
      fs.closeSync(f.fd);
    } catch {}
  }
}

/** Check the files to be received: each a new name in an existing folder of a preopen. */
export function checkIncoming(paths, preopens) {
  for (const p of paths) {
    if (!path.isAbsolute(p) || !path.basename(p)) throw new Error(`${p} cannot be received: it names no file`);
    confined(path.dirname(p), preopens, "folder");
  }
}

/**
 * Write `bytes`, then each file as one frame, to the child's stdin; resolves to the files
 * sent ({path, size: BigInt, sha256}), or [] when the stream stopped (the child stopped
 * reading, or a file changed: the child sees the frame cut short). Closes the files.
 * A file that changed between its open and its last read (fstat again then: size, mtime
 * or ctime differ; or it ended early) stops the stream before its digest, so the child
 * refuses the frame; the [] then carries `changed`, the message saying which file. A
 * rewrite within the file system's timestamp granularity that keeps the size is beyond
 * what fstat can tell.
 */
export async function send(pipe, bytes, files) {
  const write = (chunk) => new Promise((resolve, reject) => pipe.write(chunk, (e) => (e ? reject(e) : resolve())));
  const read = (fd, buf, len, pos) => new Promise((resolve, reject) => fs.read(fd, buf, 0, len, pos, (e, n) => (e ? reject(e) : resolve(n))));
  try {
    if (bytes?.length) await write(bytes);
    const sent = [];
    for (const f of files) {
      await write(Buffer.from(`${f.size}\n`));
      const hash = createHash("sha256");
      for (let off = 0; off < f.size; ) {
        const buf = Buffer.allocUnsafe(Math.min(CHUNK, f.size - off));
        const n = await read(f.fd, buf, buf.length, off);
        if (n === 0) throw changed(f.path);
        const chunk = buf.subarray(0, n);
        hash.update(chunk);
        await write(chunk);
        off += n;
      }
      if (seen(fs.fstatSync(f.fd, { bigint: true })) !== f.seen) throw changed(f.path);
      const sha256 = hash.digest("hex");
      await write(Buffer.from(`${sha256}\n`));
      sent.push({ path: f.path, size: BigInt(f.size), sha256 });
    }
    pipe.end();
    return sent;
  } catch (e) {
    pipe.destroy();
    return e instanceof Changed ? Object.assign([], { changed: e.message }) : [];
  } finally {
    closeAll(files);
  }
}

/**
 * Read the child's stdout file `fd`: its first line (at most `cap` bytes; null when longer),
 * then the frames after it into `paths`, in order, each created new beneath `preopens`.
 * Returns {line, files} or {line, error} (and then no file of this call is kept).
 */
export function receive(fd, cap, paths, preopens, modesFrom = []) {
  let pos = 0;
  const buf = Buffer.allocUnsafe(CHUNK);
  let have = 0;
  let start = 0;
  const fill = () => {
    if (start > 0) {
      buf.copy(buf, 0, start, have);
      have -= start;
      start = 0;
    }
    const n = fs.readSync(fd, buf, have, buf.length - have, pos);
    pos += n;
    have += n;
    return n;
  };
  // The first line, gathered in pieces (it may be longer than one chunk).
  const pieces = [];
  let lineLen = 0;
  for (;;) {
    if (start === have && fill() === 0) break;
    const nl = buf.indexOf(10, start);
    const end = nl >= 0 && nl < have ? nl + 1 : have;
    lineLen += end - start;
    if (lineLen > cap) return { line: null };
    pieces.push(Buffer.from(buf.subarray(start, end)));
    start = end;
    if (nl >= 0 && nl < have) break;
  }
  const line = Buffer.concat(pieces);
  const { file: fileMax, call: callMax } = fileLimits();
  const received = [];
  const fail = (why) => {
    for (const f of received) {
      try {
        fs.unlinkSync(f.path);
      } catch {}
    }
    return { line, error: why };
  };
  let total = 0;
  try {
    for (;;) {
      if (have - start < HEADER_MAX) fill();
      if (start === have) return { line, files: received };
      const nl = buf.indexOf(10, start);
      if (nl < 0 || nl >= have || nl - start >= HEADER_MAX) return fail(`frame ${received.length + 1} has no size header`);
      const header = buf.toString("latin1", start, nl);
      if (!/^[0-9]+$/.test(header)) return fail(`frame ${received.length + 1} has no size header`);
      start = nl + 1;
      const p = paths[received.length];
      if (p === undefined) return fail(`the child sent more than the ${paths.length} files asked for`);
      const size = Number(header);
      total += size;
      if (size > fileMax || total > callMax) return fail(`FILE_TOO_LARGE: frame ${received.length + 1} would pass the cap of ${fileMax} bytes a file, ${callMax} a call (protocol.json)`);
      // Said as the Rust host says it ("cannot create <path>: …"): the component tells a
      // laptop folder that changed after its check from the guest's failures by it.
      let out;
      try {
        out = fs.openSync(p, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NOFOLLOW, 0o666);
        openedWhereChecked(out, p, preopens, "file", true);
        keepMode(modesFrom[received.length] ?? "", out, preopens);
      } catch (e) {
        return fail(`cannot create ${p}: ${String(e.message).replace(`${p}: `, "")}`);
      }
      const entry = { path: p, size: BigInt(size), sha256: "" };
      received.push(entry);
      const hash = createHash("sha256");
      try {
        for (let left = size; left > 0; ) {
          if (start === have && fill() === 0) return fail(`the frame for ${p} ended after ${size - left} of ${size} bytes`);
          const n = Math.min(left, have - start);
          const chunk = buf.subarray(start, start + n);
          hash.update(chunk);
          for (let off = 0; off < n; ) off += fs.writeSync(out, chunk, off, n - off);
          start += n;
          left -= n;
        }
        fs.fdatasyncSync(out);
      } finally {
        fs.closeSync(out);
      }
      entry.sha256 = hash.digest("hex");
      while (have - start < 65 && fill() > 0);
      const trailer = buf.toString("latin1", start, Math.min(have, start + 65));
      if (trailer !== `${entry.sha256}\n`) return fail(`${p} arrived damaged: its digest is ${entry.sha256}, the sender's ${trailer.slice(0, 64)}`);
      start += 65;
    }
  } catch (e) {
    return fail(e.message);
  }
}

/** A file created for a frame takes the read and write bits of the laptop file the
 * component names for it (WIT `stdout-modes-from`: the file it may replace), always
 * readable by its owner and never executable, as boxd-host does (host-bridge/src/runtime/frames.rs
 * keep_mode). That file must be clean and inside a preopen, and a regular file (not
 * followed); anything else, or any failure, leaves the usual mode. */
function keepMode(modeFrom, fd, preopens) {
  if (!modeFrom) return;
  try {
    confined(modeFrom, preopens, "file");
    const st = fs.lstatSync(modeFrom);
    if (st.isFile()) fs.fchmodSync(fd, (st.mode & 0o666) | 0o400);
  } catch {
    // The mode is not worth a harvest.
  }
}
