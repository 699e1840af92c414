// The files a child's output goes to: unlinked, owner-only temporary files, a few made
// ahead so that making one is not on the spawn path (lib/policy.js runChild and
// lib/inworker.js both take theirs here).
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

/** What every output file's name holds (lib/inworker.js finds a child's by it). */
export const OUTPUT_FILE_MARK = `.boxd-bridge-${process.pid}-`;

/** A fresh unlinked, owner-only temporary file for a child's output; its descriptor. */
function makeOutputFile() {
  const tmp = path.join(os.tmpdir(), `${OUTPUT_FILE_MARK}${randomBytes(6).toString("hex")}.out`);
  const fd = fs.openSync(tmp, "wx+", 0o600);
  fs.unlinkSync(tmp);
  return fd;
}

// Output files made ahead, between calls: making one costs ~0.2 ms, which would otherwise
// sit between the component's request and its child's start. A boxd_status in a worker
// takes four (two children, stdout and stderr each). Never shared: each child takes its
// own, and the spares are made again once the thread is free.
const SPARE_OUTPUTS = 4;
const spareOutputs = [];
let refilling = false;
export function takeOutputFile() {
  const fd = spareOutputs.pop() ?? makeOutputFile();
  if (!refilling) {
    refilling = true;
    setImmediate(() => {
      refilling = false;
      try {
        while (spareOutputs.length < SPARE_OUTPUTS) spareOutputs.push(makeOutputFile());
      } catch {} // the next child makes its own, and reports the failure
    });
  }
  return fd;
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
