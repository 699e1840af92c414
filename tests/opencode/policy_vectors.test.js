// The shared policy vectors (tests/vectors/policy.json) against the bridge's own code:
// lib/policy.js resolveGrants, allowsProgram/allowsCwd and hostFailed. boxd-host runs the
// same file through policy.rs (tests/host/policy_vectors.rs); the format is described there.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { PLUGIN, REPO } from "./harness.mjs";

const built = fs.existsSync(path.join(PLUGIN, "dist/policy.json"));
// lib/policy.js reads dist/policy.json at import: load it only once it exists.
const policy = built ? await import(path.join(PLUGIN, "lib/policy.js")) : undefined;
const DOC = JSON.parse(fs.readFileSync(path.join(REPO, "tests/vectors/policy.json"), "utf8"));

const dirs = [];
after(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

/** `v` with every "{tmp}" in its strings replaced. */
function placed(v, tmp) {
  if (typeof v === "string") return v.replaceAll("{tmp}", tmp);
  if (Array.isArray(v)) return v.map((x) => placed(x, tmp));
  if (v && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, placed(x, tmp)]));
  return v;
}

function buildWorld(tmp, setup) {
  for (const item of setup) {
    if (item.symlink !== undefined) {
      const link = path.join(tmp, item.symlink);
      fs.mkdirSync(path.dirname(link), { recursive: true });
      fs.symlinkSync(item.to, link);
      continue;
    }
    const p = path.join(tmp, item.dir ?? item.file);
    if (item.file !== undefined) {
      fs.mkdirSync(path.dirname(p), { recursive: true });
      fs.writeFileSync(p, "#!/bin/sh\n");
    } else {
      fs.mkdirSync(p, { recursive: true });
    }
    if (item.mode) fs.chmodSync(p, parseInt(item.mode, 8));
  }
}

/** One spawn check in the vectors' words: allowed, refused (exact) or refusedStartsWith. */
function spawnCheck(grants, ask) {
  const program = policy.allowsProgram(grants, ask.program);
  const refused = program.refused ?? (ask.cwd !== undefined ? policy.allowsCwd(grants, ask.cwd).refused : undefined);
  const base = { program: ask.program, ...(ask.cwd !== undefined ? { cwd: ask.cwd } : {}) };
  if (refused === undefined) return { ...base, allowed: true };
  if (ask.refusedStartsWith !== undefined && refused.startsWith(ask.refusedStartsWith)) return ask;
  return { ...base, refused };
}

/** The outcome as the vectors word it, keeping only the fields `expect` names. */
function outcome(v, tmp) {
  const cwd = process.cwd();
  let grants;
  try {
    // Relative PATH entries must not be taken from the working directory: put it where they point.
    process.chdir(v.cwd ?? tmp);
    grants = policy.resolveGrants({ options: v.options, directory: path.join(tmp, "proj"), env: v.env });
  } catch (e) {
    if (!(e instanceof policy.HostProblem)) throw e;
    const problem = { code: e.code, next: e.next };
    if (v.expect.problem.field !== undefined) problem.field = /^plugin option '([^']*)'/.exec(e.message)?.[1];
    return { problem };
  } finally {
    process.chdir(cwd);
  }
  const pick = {
    programs: () => grants.programs,
    ledger: () => grants.ledger,
    ledgerMode: () => (fs.statSync(grants.ledger).mode & 0o777).toString(8),
    preopens: () => grants.preopens,
    childEnv: () => grants.childEnv,
    componentOptions: () => grants.componentOptions,
    spawn: () => v.expect.spawn.map((ask) => spawnCheck(grants, ask)),
    problem: () => "granted",
  };
  return Object.fromEntries(Object.keys(v.expect).map((k) => [k, pick[k]()]));
}

describe("the shared policy vectors through lib/policy.js", { skip: built ? false : "host-bridge/opencode/dist is missing: run npm run build there" }, () => {
  test("the file has its vectors", () => assert.ok(DOC.vectors.length >= 20));

  for (const raw of DOC.vectors) {
    test(raw.name, () => {
      const tmp = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "boxd-vector-")));
      dirs.push(tmp);
      const v = placed(raw, tmp);
      buildWorld(tmp, v.setup);
      assert.deepEqual(outcome(v, tmp), v.expect);
    });
  }

  test("a trap is HOST_FAILED with the vectors' words", () => {
    for (const c of DOC.hostFailed) assert.deepEqual({ ...policy.hostFailed(c.tool, c.message) }, c.expect);
  });

  test("a policy file with prose, unknown keys or bad values is refused at load", () => {
    const good = JSON.parse(fs.readFileSync(path.join(REPO, "host-bridge/policy.json"), "utf8"));
    assert.equal(policy.validatePolicy(structuredClone(good)).programs.length, good.programs.length);
    const bad = [
      [(d) => (d.about = "text"), /unknown key 'about'/],
      [(d) => (d.grantedOnlyWith.about = "text"), /'about', which programs does not list/],
      [(d) => delete d.childEnv, /missing 'childEnv'/],
      [(d) => (d.outputCaps.stdout = "64 MiB"), /outputCaps must be positive/],
      [(d) => (d.childEnv[0] = "path"), /'path' is not an environment variable name/],
      [(d) => (d.hostFailed.code = "FAILED"), /hostFailed must have code HOST_FAILED/],
    ];
    for (const [edit, says] of bad) {
      const d = structuredClone(good);
      edit(d);
      assert.throws(() => policy.validatePolicy(d), says);
    }
  });
});
