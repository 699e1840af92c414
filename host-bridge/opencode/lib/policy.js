// The bridge's grants, mirroring host-bridge/src/policy.rs and spawn/: which binary each
// program name means and which argument lists it may be given (lib/args.js), which
// folders are preopened, what environment each program's child gets, and running one child
// (argument list, no shell, its own process group, killed as a group on timeout). Deny by
// default; the data (programs, grants, env allow-lists, host-made errors) is
// dist/policy.json, a copy of host-bridge/policy.json, checked here at load.
// tests/vectors/policy.json holds resolveGrants and policy.rs `resolve` to one outcome.
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import * as frames from "./frames.js";
import { killLeftGroup, readStart, releaseOutputs, sizeOf, takeOutputFile } from "./outputs.js";
import { checkArgs, confinedTo, invalidGrants } from "./args.js";
import { mark, marked } from "./watchdog.js";

const HOST_ERRORS = { hostFailed: "HOST_FAILED", optionsInvalid: "OPTIONS_INVALID", ledgerFailed: "LEDGER_FAILED" };

/**
 * Check a policy document has exactly the policy's shape (policy.rs `PolicyFile`, with
 * the same rules); throws naming the first problem.
 */
export function validatePolicy(doc) {
  const fail = (why) => {
    throw new Error(`policy.json ${why}`);
  };
  const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
  const exactly = (v, keys, where) => {
    if (!isObject(v)) fail(`${where} must be an object`);
    for (const k of Object.keys(v)) if (!keys.includes(k)) fail(`${where} has an unknown key '${k}'`);
    for (const k of keys) if (!(k in v)) fail(`${where} is missing '${k}'`);
  };
  const strings = (v, where) => Array.isArray(v) && v.every((s) => typeof s === "string") ? v : fail(`${where} must be a list of strings`);
  exactly(doc, ["programs", "grantedOnlyWith", "childEnv", "outputCaps", "runAll", "afterExit", ...Object.keys(HOST_ERRORS)], "(document)");
  if (!Array.isArray(doc.programs) || !doc.programs.length) fail("programs is empty");
  const programs = doc.programs.map((p, i) => {
    exactly(p, ["name", "env", "grants"], `programs[${i}]`);
    if (typeof p.name !== "string" || !/^[a-z0-9-]+$/.test(p.name) || doc.programs.findIndex((o) => o.name === p.name) !== i) {
      fail(`programs: '${p.name}' is not a lowercase program name, or is listed twice`);
    }
    for (const name of strings(p.env, `programs.${p.name}.env`)) if (!/^[A-Z0-9_]+$/.test(name)) fail(`programs.${p.name}.env: '${name}' is not an environment variable name`);
    if (!Array.isArray(p.grants)) fail(`programs.${p.name}.grants must be a list`);
    p.grants.forEach((g, j) => {
      exactly(g, ["name", "args"], `programs.${p.name}.grants[${j}]`);
      strings(g.args, `programs.${p.name}.grants '${g.name}' args`);
    });
    const why = invalidGrants(p.name, p.grants);
    if (why) fail(why);
    return p.name;
  });
  if (!isObject(doc.grantedOnlyWith)) fail("grantedOnlyWith must be an object");
  for (const [program, option] of Object.entries(doc.grantedOnlyWith)) {
    if (!programs.includes(program)) fail(`grantedOnlyWith names '${program}', which programs does not list`);
    if (typeof option !== "string" || !/^[A-Za-z0-9]+$/.test(option)) fail(`grantedOnlyWith.${program}: '${option}' is not a plugin option name`);
  }
  for (const name of strings(doc.childEnv, "childEnv")) if (!/^[A-Z0-9_]+$/.test(name)) fail(`childEnv: '${name}' is not an environment variable name`);
  exactly(doc.outputCaps, ["stdout", "stderr"], "outputCaps");
  for (const k of ["stdout", "stderr"]) if (!Number.isSafeInteger(doc.outputCaps[k]) || doc.outputCaps[k] <= 0) fail("outputCaps must be positive byte counts");
  exactly(doc.runAll, ["maxRequests"], "runAll");
  if (!Number.isSafeInteger(doc.runAll.maxRequests) || doc.runAll.maxRequests < 1 || doc.runAll.maxRequests > 16) fail("runAll.maxRequests must be 1 to 16");
  exactly(doc.afterExit, ["graceMs"], "afterExit");
  if (!Number.isSafeInteger(doc.afterExit.graceMs) || doc.afterExit.graceMs < 0 || doc.afterExit.graceMs > 10000) fail("afterExit.graceMs must be 0 to 10000 ms");
  for (const [key, code] of Object.entries(HOST_ERRORS)) {
    exactly(doc[key], ["code", "next"], key);
    if (doc[key].code !== code || typeof doc[key].next !== "string" || !doc[key].next.trim()) fail(`${key} must have code ${code} and a next step`);
  }
  if (!doc.optionsInvalid.next.includes("{field}")) fail("optionsInvalid.next must name the option as {field}");
  return doc;
}

function readPolicy() {
  const file = new URL("../dist/policy.json", import.meta.url);
  let text;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch (e) {
    throw new Error(`opencode-boxd is not built (${e.message}): run npm ci && npm run build in ${path.dirname(path.dirname(file.pathname))}`);
  }
  try {
    return validatePolicy(JSON.parse(text));
  } catch (e) {
    throw new Error(`opencode-boxd: ${file.pathname} is not a valid policy (${e.message}); rebuild the plugin with npm run build`);
  }
}

export const POLICY = readPolicy();

const MiB = 1 << 20;
const human = (n) => (n >= MiB && n % MiB === 0 ? `${n / MiB} MiB` : n >= 1024 && n % 1024 === 0 ? `${n / 1024} KiB` : `${n} bytes`);

/**
 * The caps on a child's output (policy.json, as spawn/). The bridge checks afterExit.graceMs
 * with the rest of policy.json but waits no grace: its children's stderr goes to a file, so
 * nothing the child left running can hold back the answer (runChild).
 */
export const BOUNDS = {
  stdout: POLICY.outputCaps.stdout,
  stderr: POLICY.outputCaps.stderr,
};

/** What every host answers when the component traps: HOST_FAILED with errors.rs's next step. */
export function hostFailed(tool, message) {
  return { code: POLICY.hostFailed.code, message: `the component stopped while running ${tool}: ${message}`, next: POLICY.hostFailed.next };
}

// Children still running, so they can be killed when this process exits. Node has no
// PR_SET_PDEATHSIG: a plugin host that exits (normally, or by a signal OpenCode handles)
// kills them here; for one killed outright with SIGKILL, lib/watchdog.js does.
const live = new Set();
process.once("exit", () => {
  for (const kill of live) kill();
});

/** Plugin options only the host reads (binary grants); the component refuses unknown keys. */
export const HOST_ONLY_OPTIONS = ["boxd", "opencode"];

/** The plugin option naming the audit log (lib/audit.js); host-only, as policy.rs AUDIT_LOG_OPTION. */
export const AUDIT_LOG_OPTION = "auditLog";

/** A problem with the options or the machine that stops every call; shown as a tool error. */
export class HostProblem extends Error {
  constructor(code, message, next) {
    super(message);
    this.code = code;
    this.next = next;
  }
}

export const invalid = (field, why) =>
  new HostProblem(POLICY.optionsInvalid.code, `plugin option '${field}' ${why}`, POLICY.optionsInvalid.next.replaceAll("{field}", field));

/**
 * The first executable regular file called `binary` in the absolute folders of `pathVar`.
 * A relative entry ("", ".", "bin") is skipped: it would name a different program in
 * every working directory (as policy.rs find_on_path).
 */
export function findOnPath(binary, pathVar) {
  for (const dir of (pathVar ?? "").split(":").filter((d) => d.startsWith("/"))) {
    const p = path.join(dir, binary);
    try {
      const st = fs.statSync(p);
      if (st.isFile() && st.mode & 0o111) return p;
    } catch {}
  }
  return undefined;
}

/** The ledger folder, created (or narrowed to) owner-only; its canonical path. */
export function ensurePrivateDir(dir) {
  try {
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    // Narrowed, not set: group and other lose their bits, the owner's stay as the user left them.
    const mode = fs.statSync(dir).mode & 0o7777;
    if (mode & 0o077) fs.chmodSync(dir, mode & 0o7700);
    privatePasswords(dir);
    return fs.realpathSync(dir);
  } catch (e) {
    throw new HostProblem(POLICY.ledgerFailed.code, `cannot create the ledger folder ${dir}: ${e.message}`, POLICY.ledgerFailed.next);
  }
}

// Every file the component creates in the ledger is made 0600 as it is created (sandbox.js);
// a ledger written before that kept each work's server password 0644: make those 0600.
// Only in the ledger's own work folders: a name that is no work id ([a-z0-9-]), or a
// symlink (to anywhere), is the user's, and nothing under it is touched.
function privatePasswords(ledger) {
  let works = [];
  try {
    if (fs.lstatSync(path.join(ledger, "works")).isDirectory()) works = fs.readdirSync(path.join(ledger, "works"), { withFileTypes: true });
  } catch {}
  for (const w of works) {
    if (!/^[a-z0-9-]+$/.test(w.name) || !w.isDirectory()) continue;
    const p = path.join(ledger, "works", w.name, "password");
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
 * Everything one plugin instance grants, or the HostProblem that stops every call (the
 * same request → outcome as policy.rs `resolve`). `env` is the host's environment
 * (process.env); `insideOpencode` says process.execPath is the opencode binary (true in a plugin).
 */
export function resolveGrants({ options, directory, env = process.env, insideOpencode = false }) {
  if (options === null || typeof options !== "object" || Array.isArray(options)) throw invalid("(options)", "must be a JSON object");
  const var_ = (k) => (env[k] ? env[k] : undefined);
  // An absolute path in the options, or a problem naming the option.
  const optionPath = (key, why) => {
    const v = options[key];
    if (v === undefined) return undefined;
    if (typeof v !== "string" || !v.startsWith("/")) throw invalid(key, why);
    return v;
  };
  const programs = {};
  const grant = (name, file, field) => {
    let st;
    try {
      programs[name] = fs.realpathSync(file);
      st = fs.statSync(file);
    } catch {
      throw invalid(field, `names ${file}, which does not exist`);
    }
    // As policy/grants.rs `program_file`: a folder or a file without an execute bit failed
    // at every call as the boxd CLI's own failure, with a next step that led back to it.
    if (!st.isFile()) throw invalid(field, `names ${file}, which is not a program (a folder or a special file)`);
    if ((st.mode & 0o111) === 0) throw invalid(field, `names ${file}, which is not executable`);
  };
  for (const name of HOST_ONLY_OPTIONS) {
    const explicit = optionPath(name, "must be an absolute path to the program");
    if (explicit) grant(name, explicit, name);
    // Inside a plugin process.execPath IS the opencode binary: the laptop's own OpenCode.
    else if (name === "opencode" && insideOpencode) programs.opencode = process.execPath;
    else {
      const found = findOnPath(name, var_("PATH"));
      if (found) grant(name, found, name);
    }
  }
  // Programs granted only when the user opted in (policy.json grantedOnlyWith).
  for (const [program, option] of Object.entries(POLICY.grantedOnlyWith)) {
    if (options[option] !== true) continue;
    const found = findOnPath(program, var_("PATH"));
    if (found) grant(program, found, option);
  }

  // $XDG_DATA_HOME, else $HOME/.local/share (an empty or relative value counts as unset);
  // with neither there is no default ledger folder: ledgerDir must name one.
  const xdg = var_("XDG_DATA_HOME");
  const home = var_("HOME");
  const dataHome = xdg?.startsWith("/") ? xdg : home?.startsWith("/") ? path.join(home, ".local/share") : undefined;
  const defaultLedger = () => {
    if (dataHome === undefined) {
      throw invalid("ledgerDir", "is needed here: neither XDG_DATA_HOME nor HOME is an absolute folder, so there is no default ledger folder (it was made under / or the current folder)");
    }
    return path.join(dataHome, "opencode-boxd");
  };
  const ledger = ensurePrivateDir(optionPath("ledgerDir", "must be an absolute path") ?? defaultLedger());
  const project = canonicalDir(directory, "(project)");
  const roots = [];
  if (options.allowedRoots !== undefined) {
    if (!Array.isArray(options.allowedRoots)) throw invalid("allowedRoots", "must be an array of absolute folder paths");
    for (const r of options.allowedRoots) {
      if (typeof r !== "string" || !r.startsWith("/")) throw invalid("allowedRoots", "must hold absolute folder paths");
      roots.push(canonicalDir(r, "allowedRoots"));
    }
  }
  const preopens = [...new Set([ledger, project, ...roots])];
  const auditLog = optionPath(AUDIT_LOG_OPTION, "must be an absolute path to a file");

  // What the component gets as options_json: the user's options without the host-only
  // keys, allowed roots in their canonical form (as boxd-host passes them).
  const componentOptions = Object.fromEntries(Object.entries(options).filter(([k]) => !HOST_ONLY_OPTIONS.includes(k) && k !== AUDIT_LOG_OPTION));
  if (roots.length) componentOptions.allowedRoots = roots;

  // Every variable some program's child may inherit; runChild gives each program its own.
  const childEnv = {};
  for (const k of [...POLICY.childEnv, ...POLICY.programs.flatMap((p) => p.env)]) if (env[k] !== undefined) childEnv[k] = env[k];
  // Each program's argument grants and variables (policy.json programs).
  const programPolicies = POLICY.programs;
  return { programs, programPolicies, preopens, ledger, project, roots, childEnv, componentOptions, auditLog, runAllMax: POLICY.runAll.maxRequests };
}

const err = (tag, val) => ({ tag: "err", val: val === undefined ? { tag } : { tag, val } });

/** The binary granted for a program name, or why not ({binary} | {refused}), as Policy::allows. */
export function allowsProgram(grants, program) {
  if (Object.hasOwn(grants.programs, program)) return { binary: grants.programs[program] };
  return {
    refused: POLICY.programs.some((p) => p.name === program)
      ? `${program}: not found on this host (set the "${program}" plugin option or put it on PATH)`
      : `${program}: not in the host's policy (allowed: ${POLICY.programs.map((p) => p.name).join(", ")})`,
  };
}

/**
 * The binary, the grant and the child's environment for one call of the component's
 * ({binary, grant, env} | {refused}), as Policy::allows_call and Policy::child_env: the
 * program must be granted, its arguments must match one of its grants
 * (grants.programPolicies, which resolveGrants takes from policy.json), and its child
 * inherits only the shared childEnv and its own env.
 */
export function allowsCall(grants, program, args) {
  const found = allowsProgram(grants, program);
  if (found.refused) return found;
  const rules = (grants.programPolicies ?? []).find((p) => p.name === program);
  if (!rules) return { refused: `${program}: the host has no argument grants for it` };
  const checked = checkArgs(program, rules.grants, args, confinedTo(grants.preopens ?? []));
  if (checked.refused) return checked;
  return { binary: found.binary, grant: checked.grant, env: childEnvFor(grants, program) };
}

/** The variables `program`'s child may get: the shared childEnv and its own env. */
function childEnvNames(grants, program) {
  return [...POLICY.childEnv, ...((grants.programPolicies ?? []).find((p) => p.name === program)?.env ?? [])];
}

/** What `program`'s child inherits: the shared childEnv and its own env, as Policy::child_env. */
export function childEnvFor(grants, program) {
  const names = childEnvNames(grants, program);
  return Object.fromEntries(Object.entries(grants.childEnv).filter(([k]) => names.includes(k)));
}

/**
 * The component may set only variables the policy would pass `program` anyway: no
 * LD_PRELOAD, no endpoint of its choosing ({} | {refused}), as Policy::allows_env.
 */
export function allowsEnv(grants, program, pairs) {
  const names = childEnvNames(grants, program);
  const name = pairs.map(([k]) => k).find((k) => !names.includes(k));
  if (name === undefined) return {};
  return { refused: `${program} may not be given ${name}: the component may set only the variables host-bridge/policy.json passes to ${program} (childEnv and programs.${program}.env)` };
}

/** A child's working directory must lie inside a preopen ({cwd} | {refused}), as Policy::allows_cwd. */
export function allowsCwd(grants, cwd) {
  let real;
  try {
    real = fs.realpathSync(cwd);
  } catch {
    return { refused: `${cwd} does not exist` };
  }
  if (grants.preopens.some((p) => real === p || real.startsWith(p.endsWith("/") ? p : `${p}/`))) return { cwd: real };
  return { refused: `${cwd} is outside the preopened folders` };
}

/**
 * What one request runs, as the policy allows it ({binary, cwd, env}), or the spawn's
 * refusal ({refused}: the WIT error): a granted program and arguments, a working
 * directory inside a preopen, the program's environment plus the request's pairs for names it lists.
 */
export function checkLaunch(req, grants) {
  const program = allowsCall(grants, req.program, req.args);
  if (program.refused) return { refused: err("not-allowed", program.refused) };
  let cwd;
  if (req.cwd != null) {
    const c = allowsCwd(grants, req.cwd);
    if (c.refused) return { refused: err("not-allowed", c.refused) };
    cwd = c.cwd;
  }
  const asked = allowsEnv(grants, req.program, req.env ?? []);
  if (asked.refused) return { refused: err("not-allowed", asked.refused) };
  return { binary: program.binary, cwd, env: { ...program.env, ...Object.fromEntries(req.env ?? []) }, grant: `${req.program} ${program.grant.name}` };
}

/** The spawn's failure when `program` printed past `stream`'s cap and was killed. */
export function overCap(program, stream) {
  const cap = BOUNDS[stream];
  return err("failed", `${program} printed more than ${human(cap)} on ${stream}; the cap is ${human(cap)} (host-bridge/policy.json outputCaps.${stream}), so the host killed it`);
}

/**
 * Run one child for the component: the WIT spawn.run, async on this thread. Resolves to
 * {tag:"ok", val:{exitCode, stdout, stderr}} or {tag:"err", val:{tag, val?}}; never rejects.
 * `track` receives a kill function while the child runs (for aborts).
 */
export function runChild(req, grants, track = () => () => {}, onGrant = () => {}) {
  const launch = checkLaunch(req, grants);
  if (launch.refused) return Promise.resolve(launch.refused);
  onGrant(launch.grant);
  const { binary, cwd, env } = launch;
  // Streamed files are checked (and those sent opened) before the child starts.
  const stdoutFiles = req.stdoutFiles ?? [];
  let outgoing;
  try {
    outgoing = frames.openOutgoing(req.stdinFiles ?? [], grants.preopens);
    frames.checkIncoming(stdoutFiles, grants.preopens);
  } catch (e) {
    if (outgoing) frames.closeAll(outgoing);
    return Promise.resolve(err("failed", e.message));
  }
  const hasStdin = Boolean(req.stdin) || outgoing.length > 0;
  const stdoutCap = BOUNDS.stdout + frames.stdoutAllowance(stdoutFiles.length);

  return new Promise((resolve) => {
    // stdout and stderr go to unlinked temporary files, not pipes: a program that exits
    // right after a large write loses what a full pipe had not taken (the real `opencode
    // export` delivers exactly 64 KiB through a pipe, all of it into a file), a process the
    // child leaves running cannot hold the answer by holding a pipe open, and a child with
    // no pipe costs its runtime less to start and to wait on (docs/performance.md).
    const files = [];
    try {
      // One at a time: a second that cannot be made must not leave the first unrecorded.
      files.push(takeOutputFile());
      files.push(takeOutputFile());
    } catch (e) {
      for (const fd of files) fs.closeSync(fd);
      frames.closeAll(outgoing);
      return resolve(err("failed", `${req.program}: cannot make its output file: ${e.message}`));
    }
    const [outFd, errFd] = files;
    // Announced to the watchdog before the child exists, so it is guarded from its start.
    const guard = mark();
    let child;
    try {
      // detached: a new process group (setsid), so a timeout can kill grandchildren too
      // (as spawn/ does with its own process group).
      child = spawn(binary, req.args, { cwd, env: marked(guard.env, env), detached: true, stdio: [hasStdin ? "pipe" : "ignore", outFd, errFd] });
    } catch (e) {
      guard.release();
      for (const fd of files) fs.closeSync(fd);
      frames.closeAll(outgoing);
      return resolve(err("failed", `${binary}: ${e.message}`));
    }
    let settled = false;
    let timedOut = false;
    let exitCode;
    const killGroup = () => {
      // Reaped, its pid may be another's: what is left of its group is killed only while
      // it is still that group (outputs.js).
      if (child.exitCode !== null || child.signalCode !== null) return killLeftGroup(child.pid);
      try {
        process.kill(-child.pid, "SIGKILL");
      } catch {}
      // And the child itself, should it not lead its group (it moved itself, or a runtime
      // ignored `detached`).
      try {
        process.kill(child.pid, "SIGKILL");
      } catch {}
    };
    const untrack = track(killGroup);
    live.add(killGroup);
    // The output files' sizes are checked against their caps while the child runs (and,
    // after the answer, while something it left in its group may still write, releaseOutputs).
    const watch = setInterval(() => {
      const over = sizeOf(outFd) > stdoutCap ? "stdout" : sizeOf(errFd) > BOUNDS.stderr ? "stderr" : null;
      if (over) {
        killGroup();
        finish(overCap(req.program, over));
      }
    }, 50);
    const finish = (result) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      clearInterval(watch);
      untrack();
      live.delete(killGroup);
      guard.release();
      if (typeof result === "function") {
        try {
          result = result();
        } catch (e) {
          // Reading the output failed (an I/O error): still an answer, never an exception
          // thrown into the plugin's event loop with the call left waiting.
          result = err("failed", `${req.program}: cannot read its output: ${e?.message ?? e}`);
        }
      }
      releaseOutputs(child.pid, [
        [outFd, stdoutCap],
        [errFd, BOUNDS.stderr],
      ]);
      resolve(result);
    };
    const timer = setTimeout(() => {
      // Exited already, only the files still being sent: answer with what it printed.
      if (exitCode !== undefined) return finish(result);
      timedOut = true;
      killGroup();
      // Settle even if no exit event ever comes.
      setTimeout(() => finish(err("timed-out")), 2000).unref?.();
    }, Math.max(1, req.timeoutMs));
    child.on("error", (e) => {
      finish(e.code === "ENOENT" ? err("not-found", binary) : err("failed", `${binary}: ${e.message}`));
    });
    // The files sent, once every byte of stdin was: a child that exits without reading
    // gives EPIPE, which is not our failure (it answered without them; none is reported).
    let sent = [];
    let sending = Promise.resolve();
    if (hasStdin) {
      child.stdin.on("error", () => {});
      const bytes = req.stdin ? Buffer.from(req.stdin.buffer, req.stdin.byteOffset, req.stdin.byteLength) : null;
      sending = frames.send(child.stdin, bytes, outgoing).then((got) => (sent = got));
    }
    const result = () => {
      // A file changed while it was sent: the child saw its frame cut short and refused;
      // the spawn fails saying which file (as spawn/ does).
      if (sent.changed) return err("failed", `${req.program}: ${sent.changed}`);
      // Past a cap only now, after the exit: the group is killed as for any child past a
      // cap (what the child left in it may still be writing). stdout first, as the watch.
      let stdout;
      if (!stdoutFiles.length) {
        stdout = readStart(outFd, BOUNDS.stdout + 1);
        if (stdout.length > BOUNDS.stdout) {
          killGroup();
          return overCap(req.program, "stdout");
        }
      }
      const stderr = readStart(errFd, BOUNDS.stderr + 1);
      if (stderr.length > BOUNDS.stderr) {
        killGroup();
        return overCap(req.program, "stderr");
      }
      const val = { exitCode: exitCode ?? undefined, stderr: new Uint8Array(stderr), files: [...sent] };
      if (stdout) return { tag: "ok", val: { ...val, stdout: new Uint8Array(stdout) } };
      const got = frames.receive(outFd, BOUNDS.stdout, stdoutFiles, grants.preopens, req.stdoutModesFrom ?? []);
      if (got.line === null) {
        killGroup();
        return overCap(req.program, "stdout");
      }
      // A child that failed says so in its answer; its files did not come.
      if (got.error && exitCode !== 0) return { tag: "ok", val: { ...val, stdout: new Uint8Array(got.line) } };
      if (got.error) return err("failed", `${req.program}: the files framed on its stdout: ${got.error}`);
      return { tag: "ok", val: { ...val, stdout: new Uint8Array(got.line), files: [...sent, ...got.files] } };
    };
    child.on("exit", (code, signal) => {
      // Taken back from the watchdog now, not when answered: what the child left running
      // is left alone, as boxd-host leaves it.
      guard.release();
      exitCode = code ?? (signal ? null : undefined);
      if (timedOut) return finish(err("timed-out"));
      // The writer reports within a moment of the exit, unless something the child left
      // running holds its stdin: then nothing is reported sent.
      Promise.race([sending, new Promise((r) => setTimeout(r, 1000).unref?.())]).then(() => finish(result));
    });
  });
}
