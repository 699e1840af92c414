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
 * The log at `file`, created 0600 (a file there already is narrowed to 0600) and appended
 * to; throws when it cannot be opened. `record` never throws: a full disk must not fail
 * the tool call it describes.
 */
export function openAuditLog(file) {
  const fd = fs.openSync(file, "a", 0o600);
  fs.fchmodSync(fd, 0o600);
  return {
    record(tool, durationMs, result, spawns) {
      const line = { tool, duration_ms: Math.max(0, Math.round(durationMs)), result, spawns };
      try {
        fs.writeSync(fd, `${JSON.stringify(line)}\n`);
      } catch {}
    },
    close() {
      try {
        fs.closeSync(fd);
      } catch {}
    },
  };
}
