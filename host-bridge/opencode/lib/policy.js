// The bridge's grants, mirroring host-bridge/src/policy.rs and spawn.rs: which binary each
// program name means, which folders are preopened, what environment a child gets, and
// running one child (argument list, no shell, its own process group, killed as a group on
// timeout). Deny by default; the data (names, env allow-list) is dist/policy.json, a copy
// of host-bridge/policy.json, so every host applies the same list.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

function readPolicy() {
  const file = new URL("../dist/policy.json", import.meta.url);
  try {
    return JSON.parse(fs.readFileSync(file, "utf8"));
  } catch (e) {
    throw new Error(`opencode-boxd is not built (${e.message}): run npm ci && npm run build in ${path.dirname(path.dirname(file.pathname))}`);
  }
}

export const POLICY = readPolicy();

const MiB = 1 << 20;
const human = (n) => (n >= MiB && n % MiB === 0 ? `${n / MiB} MiB` : n >= 1024 && n % 1024 === 0 ? `${n / 1024} KiB` : `${n} bytes`);

/** The caps on a child's output and the grace after it exits (policy.json, as spawn.rs). */
export const BOUNDS = {
  stdout: POLICY.outputCaps.stdout,
  stderr: POLICY.outputCaps.stderr,
  afterExitMs: POLICY.afterExit.graceMs,
};

/** What every host answers when the component traps: HOST_FAILED with errors.rs's next step. */
export function hostFailed(tool, message) {
  return { code: POLICY.hostFailed.code, message: `the component stopped while running ${tool}: ${message}`, next: POLICY.hostFailed.next };
}

// Children still running, so they can be killed when this process exits. Node has no
// PR_SET_PDEATHSIG: a plugin host that exits (normally, or by a signal OpenCode handles)
// kills them here; one killed outright with SIGKILL cannot, and its children run on until
// they end (docs/architecture.md).
const live = new Set();
process.once("exit", () => {
  for (const kill of live) kill();
});

/** Plugin options only the host reads (binary grants); the component refuses unknown keys. */
export const HOST_ONLY_OPTIONS = ["boxd", "opencode"];

/** A problem with the options or the machine that stops every call; shown as a tool error. */
export class HostProblem extends Error {
  constructor(code, message, next) {
    super(message);
    this.code = code;
    this.next = next;
  }
}

const invalid = (field, why) =>
  new HostProblem("OPTIONS_INVALID", `plugin option '${field}' ${why}`, `Fix '${field}' in the plugin options (docs/configuration.md lists them), then restart OpenCode.`);

export function findOnPath(binary, pathVar) {
  for (const dir of (pathVar ?? "").split(":").filter(Boolean)) {
    const p = path.join(dir, binary);
    try {
      const st = fs.statSync(p);
      if (st.isFile() && st.mode & 0o111) return p;
    } catch {}
  }
  return undefined;
}

/** The ledger folder, created owner-only (WASI cannot set modes, so the host does). */
export function ensurePrivateDir(dir) {
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  fs.chmodSync(dir, 0o700);
  privatePasswords(dir);
  return fs.realpathSync(dir);
}

// Every file the component creates in the ledger is made 0600 as it is created (worker.js);
// a ledger written before that kept each work's server password 0644: make those 0600.
function privatePasswords(ledger) {
  let works = [];
  try {
    works = fs.readdirSync(path.join(ledger, "works"));
  } catch {}
  for (const w of works) {
    const p = path.join(ledger, "works", w, "password");
    try {
      const st = fs.lstatSync(p);
      if (st.isFile() && st.mode & 0o077) fs.chmodSync(p, 0o600);
    } catch {}
  }
}

function canonicalDir(p, field) {
  let real;
  try {
    real = fs.realpathSync(p);
  } catch {
    throw invalid(field, `names ${p}, which does not exist`);
  }
  if (!fs.statSync(real).isDirectory()) throw invalid(field, `names ${p}, which is not a folder`);
  return real;
}

/**
 * Everything one plugin instance grants. `env` is the host's environment (process.env);
 * `insideOpencode` says process.execPath is the opencode binary (true in a plugin).
 */
export function resolveGrants({ options, directory, env = process.env, insideOpencode = false }) {
  if (options === null || typeof options !== "object" || Array.isArray(options)) throw invalid("(options)", "must be a JSON object");
  const programs = {};
  const grant = (name, file, field) => {
    if (!POLICY.programs.includes(name)) throw new Error(`'${name}' is not a program the plugin uses`);
    try {
      programs[name] = fs.realpathSync(file);
    } catch {
      throw invalid(field, `names ${file}, which does not exist`);
    }
  };
  for (const name of HOST_ONLY_OPTIONS) {
    if (options[name] !== undefined && (typeof options[name] !== "string" || !path.isAbsolute(options[name]))) {
      throw invalid(name, "must be an absolute path to the program");
    }
  }
  if (options.boxd) grant("boxd", options.boxd, "boxd");
  else {
    const found = findOnPath("boxd", env.PATH);
    if (found) grant("boxd", found, "boxd");
  }
  // Programs granted only when the user opted in (policy.json grantedOnlyWith).
  for (const [program, option] of Object.entries(POLICY.grantedOnlyWith)) {
    if (program === "about" || options[option] !== true) continue;
    const found = findOnPath(program, env.PATH);
    if (found) grant(program, found, option);
  }
  // Inside a plugin process.execPath IS the opencode binary: the laptop's own OpenCode.
  if (options.opencode) grant("opencode", options.opencode, "opencode");
  else if (insideOpencode) programs.opencode = process.execPath;
  else {
    const found = findOnPath("opencode", env.PATH);
    if (found) grant("opencode", found, "opencode");
  }

  const dataHome = env.XDG_DATA_HOME || path.join(env.HOME || os.homedir(), ".local/share");
  if (options.ledgerDir !== undefined && (typeof options.ledgerDir !== "string" || !path.isAbsolute(options.ledgerDir))) {
    throw invalid("ledgerDir", "must be an absolute path");
  }
  let ledger;
  try {
    ledger = ensurePrivateDir(options.ledgerDir ?? path.join(dataHome, "opencode-boxd"));
  } catch (e) {
    throw new HostProblem("LEDGER_FAILED", `cannot create the ledger folder: ${e.message}`, "Check that the ledger folder is writable, then restart OpenCode.");
  }
  const project = canonicalDir(directory, "(project)");
  const roots = [];
  if (options.allowedRoots !== undefined) {
    if (!Array.isArray(options.allowedRoots)) throw invalid("allowedRoots", "must be an array of absolute folder paths");
    for (const r of options.allowedRoots) {
      if (typeof r !== "string" || !path.isAbsolute(r)) throw invalid("allowedRoots", "must hold absolute folder paths");
      roots.push(canonicalDir(r, "allowedRoots"));
    }
  }
  const preopens = [...new Set([ledger, project, ...roots])];

  // What the component gets as options_json: the user's options without the host-only
  // keys, allowed roots in their canonical form (as boxd-host passes them).
  const componentOptions = Object.fromEntries(Object.entries(options).filter(([k]) => !HOST_ONLY_OPTIONS.includes(k)));
  if (roots.length) componentOptions.allowedRoots = roots;

  const childEnv = {};
  for (const k of POLICY.childEnv) if (env[k] !== undefined) childEnv[k] = env[k];
  return { programs, preopens, ledger, project, roots, childEnv, componentOptions };
}

const err = (tag, val) => ({ tag: "err", val: val === undefined ? { tag } : { tag, val } });

function withinPreopen(cwd, preopens) {
  let real;
  try {
    real = fs.realpathSync(cwd);
  } catch {
    return { refused: `${cwd} does not exist` };
  }
  if (preopens.some((p) => real === p || real.startsWith(p.endsWith("/") ? p : `${p}/`))) return { cwd: real };
  return { refused: `${cwd} is outside the preopened folders` };
}

/**
 * Run one child for the component: the WIT spawn.run, async on this thread. Resolves to
 * {tag:"ok", val:{exitCode, stdout, stderr}} or {tag:"err", val:{tag, val?}}; never rejects.
 * `track` receives a kill function while the child runs (for aborts).
 */
export function runChild(req, grants, track = () => () => {}) {
  const binary = Object.hasOwn(grants.programs, req.program) ? grants.programs[req.program] : undefined;
  if (!binary) {
    const why = POLICY.programs.includes(req.program)
      ? `${req.program}: not found on this host (set the "${req.program}" plugin option or put it on PATH)`
      : `${req.program}: not in the host's policy (allowed: ${POLICY.programs.join(", ")})`;
    return Promise.resolve(err("not-allowed", why));
  }
  let cwd;
  if (req.cwd != null) {
    const c = withinPreopen(req.cwd, grants.preopens);
    if (c.refused) return Promise.resolve(err("not-allowed", c.refused));
    cwd = c.cwd;
  }
  const env = { ...grants.childEnv };
  for (const [k, v] of req.env ?? []) env[k] = v;

  return new Promise((resolve) => {
    // stdout goes to an unlinked temporary file, not a pipe: a program that exits right
    // after a large write loses what a full pipe had not taken (the real `opencode export`
    // delivers exactly 64 KiB through a pipe, all of it into a file). As spawn.rs does.
    let outFd;
    try {
      const tmp = path.join(os.tmpdir(), `.boxd-bridge-${process.pid}-${randomBytes(6).toString("hex")}.out`);
      outFd = fs.openSync(tmp, "wx+", 0o600);
      fs.unlinkSync(tmp);
    } catch (e) {
      return resolve(err("failed", `${req.program}: cannot make its output file: ${e.message}`));
    }
    let child;
    try {
      // detached: a new process group (setsid), so a timeout can kill grandchildren too
      // (as spawn.rs does with process_group).
      child = spawn(binary, req.args, { cwd, env, detached: true, stdio: [req.stdin ? "pipe" : "ignore", outFd, "pipe"] });
    } catch (e) {
      fs.closeSync(outFd);
      return resolve(err("failed", `${binary}: ${e.message}`));
    }
    const errs = [];
    let errSize = 0;
    let settled = false;
    let timedOut = false;
    let grace;
    let exitCode;
    const killGroup = () => {
      try {
        process.kill(-child.pid, "SIGKILL");
      } catch {}
    };
    const untrack = track(killGroup);
    live.add(killGroup);
    const overCap = (stream) => {
      const cap = BOUNDS[stream];
      return err("failed", `${req.program} printed more than ${human(cap)} on ${stream}; the cap is ${human(cap)} (host-bridge/policy.json outputCaps.${stream}), so the host killed it`);
    };
    const stdoutSize = () => {
      try {
        return fs.fstatSync(outFd).size;
      } catch {
        return 0;
      }
    };
    // The stdout file's size is checked against its cap while the child runs.
    const watch = setInterval(() => {
      if (stdoutSize() > BOUNDS.stdout) {
        killGroup();
        finish(overCap("stdout"));
      }
    }, 50);
    const readStdout = () => {
      const size = Math.min(stdoutSize(), BOUNDS.stdout + 1);
      const buf = Buffer.alloc(size);
      let off = 0;
      while (off < size) {
        const n = fs.readSync(outFd, buf, off, size - off, off);
        if (n === 0) break;
        off += n;
      }
      return buf.subarray(0, off);
    };
    const finish = (result, drain = false) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      clearTimeout(grace);
      clearInterval(watch);
      untrack();
      live.delete(killGroup);
      if (typeof result === "function") result = result();
      try {
        fs.closeSync(outFd);
      } catch {}
      if (drain) {
        // A process the child left running still holds stderr: keep reading (and
        // dropping) so it neither blocks nor dies of SIGPIPE, without holding the plugin.
        child.stderr?.unref?.();
        child.unref();
      } else {
        child.stderr?.destroy();
      }
      resolve(result);
    };
    const timer = setTimeout(() => {
      // Exited already, only stderr trickling from what it left behind: answer with that.
      if (exitCode !== undefined) return finish(result, true);
      timedOut = true;
      killGroup();
      try {
        process.kill(child.pid, "SIGKILL"); // a child that left its group (setsid)
      } catch {}
      // Settle even if no exit event ever comes.
      setTimeout(() => finish(err("timed-out")), 2000).unref?.();
    }, Math.max(1, req.timeoutMs));
    child.on("error", (e) => {
      finish(e.code === "ENOENT" ? err("not-found", binary) : err("failed", `${binary}: ${e.message}`));
    });
    // Past a cap the group is killed and the spawn fails naming the stream and the cap.
    child.stderr.on("data", (c) => {
      if (settled) return;
      if (errSize + c.length > BOUNDS.stderr) {
        killGroup();
        finish(overCap("stderr"));
        return;
      }
      errSize += c.length;
      errs.push(c);
      // After the child's exit the grace counts from the last bytes, not from the exit.
      if (grace) grace.refresh();
    });
    if (req.stdin) {
      // A child that exits without reading gives EPIPE; that is not our failure.
      child.stdin.on("error", () => {});
      child.stdin.end(Buffer.from(req.stdin.buffer, req.stdin.byteOffset, req.stdin.byteLength));
    }
    const result = () => {
      const stdout = readStdout();
      if (stdout.length > BOUNDS.stdout) return overCap("stdout");
      return { tag: "ok", val: { exitCode: exitCode ?? undefined, stdout: new Uint8Array(stdout), stderr: new Uint8Array(Buffer.concat(errs)) } };
    };
    child.on("exit", (code, signal) => {
      exitCode = code ?? (signal ? null : undefined);
      if (timedOut) return finish(err("timed-out"));
      // A background process the child started may keep stderr open, which would hold
      // `close` forever: read on for a short grace after the child exits, then answer with
      // what the child printed. That process is left alone (a CLI's daemon is not ours to
      // kill), as boxd-host does.
      grace = setTimeout(() => finish(result, true), BOUNDS.afterExitMs);
    });
    child.on("close", () => finish(timedOut ? err("timed-out") : result));
  });
}
