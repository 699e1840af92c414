// The shared policy vectors (tests/vectors/policy.json) against the bridge's own code:
// lib/policy.js resolveGrants, allowsCall/allowsCwd/allowsEnv and hostFailed. boxd-host runs the
// same file through policy.rs (tests/host/policy_vectors.rs); the format is described there.
// Then the test-only probe component ($BOXD_PROBE_WASM) makes the dangerous calls through
// the bridge's plugin module, as tests/host/confinement.rs makes them through boxd-host.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { PLUGIN, REPO, probePluginHooks } from "./harness.mjs";

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

/** One spawn check in the vectors' words: allowed (with its grant), refused (exact) or refusedStartsWith. */
function spawnCheck(grants, ask) {
  const call = policy.allowsCall(grants, ask.program, ask.args ?? []);
  const refused = call.refused ?? (ask.cwd !== undefined ? policy.allowsCwd(grants, ask.cwd).refused : undefined) ?? policy.allowsEnv(grants, ask.program, ask.env ?? []).refused;
  const base = { program: ask.program, ...(ask.args !== undefined ? { args: ask.args } : {}), ...(ask.cwd !== undefined ? { cwd: ask.cwd } : {}), ...(ask.env !== undefined ? { env: ask.env } : {}) };
  if (refused === undefined) return { ...base, allowed: true, grant: call.grant.name };
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
    childEnvOf: () => Object.fromEntries(Object.keys(v.expect.childEnvOf).map((p) => [p, policy.childEnvFor(grants, p)])),
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
      [(d) => (d.programs[0].env[0] = "token"), /programs.boxd.env: 'token'/],
      [(d) => (d.programs[0].grants[0].why = "text"), /unknown key 'why'/],
      [(d) => (d.programs[0].grants[0].args[0] = "{any}"), /the first token must be a literal/],
      [(d) => (d.programs[2].grants[0].args = []), /the first token must be a literal/],
      [(d) => d.programs[0].grants[0].args.push("{rest}", "x"), /\{rest\} may only be the last token/],
      [(d) => (d.programs[0].grants[1].args[2] = "oc-{any}"), /'oc-\{any\}' is not a literal/],
      [(d) => (d.runAll.maxRequests = 0), /runAll.maxRequests must be 1 to 16/],
    ];
    for (const [edit, says] of bad) {
      const d = structuredClone(good);
      edit(d);
      assert.throws(() => policy.validatePolicy(d), says);
    }
  });
});

const PROBE = process.env.BOXD_PROBE_WASM;

describe("the probe's dangerous calls through the bridge", { skip: built && PROBE ? false : "needs dist/ and BOXD_PROBE_WASM (tests/host/policy_vectors.rs sets both)" }, () => {
  let hooks;
  let dir;
  after(async () => {
    await hooks?.dispose();
  });

  /** The probe's spawn tool as OpenCode calls it: the text the host answered. */
  async function spawn(argv) {
    return call("spawn", { argv });
  }

  /** A probe tool as OpenCode calls it. */
  async function call(tool, args) {
    if (!hooks) {
      dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "boxd-probe-grants-")));
      dirs.push(dir);
      hooks = await probePluginHooks(dir, PROBE);
    }
    const ctx = { sessionID: "ses_probe", abort: new AbortController().signal, metadata() {}, async ask() {} };
    return (await hooks.tool[tool].execute(args, ctx)).output;
  }

  test("each dangerous call is refused naming the arguments and the nearest grant; granted calls run", { timeout: 120000 }, async () => {
    for (const [argv, says] of [
      [["opencode", "run", "rm -rf ~"], 'opencode run "rm -rf ~": no grant of opencode starts with run; its grants: version, import, export'],
      [["opencode", "auth", "logout"], "opencode auth logout: no grant of opencode starts with auth"],
      [["boxd", "auth", "logout"], "boxd auth logout: no grant allows these arguments; the nearest, boxd account, allows boxd auth --json"],
      [["boxd", "machine", "remove", "web", "-y", "--json"], "boxd machine remove web -y --json: no grant allows these arguments; the nearest, boxd machine-remove, allows boxd machine remove oc-{name} -y --json"],
      [["boxd", "env", "set", "OPENAI_API_KEY", "sk-x"], "boxd env set OPENAI_API_KEY sk-x: no grant allows these arguments; the nearest, boxd env-list, allows boxd env list --json"],
      [["boxd", "api-keys", "create"], "boxd api-keys create: no grant of boxd starts with api-keys"],
      [["boxd", "machine", "exec", "oc-w1", "--timeout", "60", "sh"], "the nearest, boxd machine-exec"],
      [["boxd"], "boxd: no grant of boxd takes no arguments"],
    ]) {
      const answer = await spawn(argv);
      assert.ok(answer.startsWith("not-allowed: ") && answer.includes(says), `${argv.join(" ")}: ${answer}`);
    }
    for (const argv of [["boxd", "machine", "list", "--json"], ["boxd", "machine", "exec", "oc-w1", "--timeout", "60", "--", "sh", "-c", "'x'"], ["opencode", "--version"]]) {
      assert.equal(await spawn(argv), "ok exit=Some(0)", argv.join(" "));
    }
  });

  test("run-all checks each request as run does: a refusal stops only its own, the answers in request order", { timeout: 120000 }, async () => {
    const argvs = [["boxd", "machine", "list", "--json"], ["boxd", "auth", "logout"], ["sh"], ["opencode", "--version"]];
    const lines = (await call("spawn-all", { argvs })).split("\n");
    assert.equal(lines.length, 4, lines.join("\n"));
    assert.equal(lines[0], "ok exit=Some(0)");
    assert.ok(lines[1].startsWith("not-allowed: ") && lines[1].includes("the nearest, boxd account"), lines[1]);
    assert.ok(lines[2].startsWith("not-allowed: "), lines[2]);
    assert.equal(lines[3], "ok exit=Some(0)");
    // More than policy.json's runAll.maxRequests: refused whole, nothing runs.
    const max = JSON.parse(fs.readFileSync(path.join(REPO, "host-bridge/policy.json"), "utf8")).runAll.maxRequests;
    const many = (await call("spawn-all", { argvs: Array(max + 1).fill(["opencode", "--version"]) })).split("\n");
    assert.equal(many.length, max + 1);
    for (const l of many) assert.ok(l.startsWith(`failed: run-all takes at most ${max} requests`) && l.includes("none ran"), l);
  });
});
