// The bridge's audit log, as boxd-host's `--audit-log` (host-bridge/src/audit.rs): with the
// plugin option `auditLog`, one JSON line per tool call, appended to an owner-only file.
// A line names the tool, its duration and result, and each spawn request the call made —
// the grant it matched (null when refused), its outcome and its masked arguments — with
// audit.rs's field names. The worker (dist/worker.js) keeps a call's spawn records, from
// both spawn paths (a child run in the worker, one run on the plugin's thread), and hands
// them back with the call's answer. Unlike boxd-host's, a line has no `paths`: the shim's
// filesystem is not traced.
import fs from "node:fs";

/**
 * Mask values that look like credentials, as trace.rs `mask_args`: the component never
 * puts secrets in argv, and this keeps a mistake out of the log all the same.
 */
export function maskArgs(args) {
  const secretKey = (k) => ["TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD"].some((s) => k.toUpperCase().includes(s));
  const out = [];
  let maskNext = false;
  for (const a of args) {
    if (maskNext) {
      out.push("***");
      maskNext = false;
    } else if (a === "--token" || a === "--password") {
      maskNext = true;
      out.push(a);
    } else if (a.startsWith("bxd_") || a.startsWith("bxds_")) {
      out.push("***");
    } else if (a.includes("=") && secretKey(a.slice(0, a.indexOf("=")))) {
      out.push(`${a.slice(0, a.indexOf("="))}=***`);
    } else {
      out.push(a);
    }
  }
  return out;
}

const OUTCOMES = { "not-allowed": "not-allowed", "not-found": "not-found", "timed-out": "timed-out" };

/**
 * One spawn request's record, as trace.rs `SpawnRecord`: `grant` is "PROGRAM GRANT" or
 * undefined (refused, or never checked), `answer` the WIT result the component got.
 */
export function spawnRecord(req, grant, answer, durationMs) {
  const exited = answer?.tag === "ok";
  return {
    program: req.program,
    args: maskArgs(req.args ?? []),
    grant: grant ?? null,
    exit_code: exited ? answer.val.exitCode ?? null : null,
    outcome: exited ? "exited" : OUTCOMES[answer?.val?.tag] ?? "failed",
    duration_ms: Math.max(0, Math.round(durationMs)),
  };
}

/**
 * Open `file` to append, as audit.rs `open_log`: created 0600, never through a symbolic
 * link, never blocking (a FIFO there would block the open forever), only a regular file;
 * a file there already is narrowed to 0600. Throws with the reason.
 */
function openLog(file) {
  const { O_WRONLY, O_APPEND, O_CREAT, O_NOFOLLOW, O_NONBLOCK } = fs.constants;
  let fd;
  try {
    fd = fs.openSync(file, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK, 0o600);
  } catch (e) {
    if (e.code === "ELOOP") throw new Error("it is a symbolic link");
    if (e.code === "ENXIO") throw new Error("it is a FIFO or socket, not a regular file");
    throw e;
  }
  try {
    if (!fs.fstatSync(fd).isFile()) throw new Error("it is not a regular file");
    fs.fchmodSync(fd, 0o600);
  } catch (e) {
    fs.closeSync(fd);
    throw e;
  }
  return fd;
}

/** Whether `fd` is still the file at `file` (not deleted, not rotated away). */
function stillAt(fd, file) {
  try {
    const a = fs.fstatSync(fd);
    const b = fs.lstatSync(file);
    return a.nlink > 0 && a.dev === b.dev && a.ino === b.ino;
  } catch {
    return false;
  }
}

/**
 * The log at `file` (openLog); throws when it cannot be opened. Each line goes out whole
 * in one write on an O_APPEND descriptor, so lines from several hosts at once never
 * interleave; a log deleted or rotated away is made again at its path. `record` never
 * throws: a full disk must not fail the tool call it describes, so a line that cannot be
 * written is said on stderr.
 */
export function openAuditLog(file) {
  let fd = openLog(file);
  return {
    record(tool, durationMs, result, spawns) {
      const line = { tool, duration_ms: Math.max(0, Math.round(durationMs)), result, spawns };
      const bytes = Buffer.from(`${JSON.stringify(line)}\n`);
      try {
        if (!stillAt(fd, file)) {
          const fresh = openLog(file);
          try {
            fs.closeSync(fd);
          } catch {}
          fd = fresh;
        }
        const n = fs.writeSync(fd, bytes);
        if (n !== bytes.length) throw new Error(`only ${n} of ${bytes.length} bytes were written`);
      } catch (e) {
        console.error(`opencode-boxd: cannot write the audit log ${file}: ${e.message}; the line for ${tool} is lost`);
      }
    },
    close() {
      try {
        fs.closeSync(fd);
      } catch {}
    },
  };
}
