// tests/conformance/scenario.json through the OpenCode bridge: every step is one tool call
// the scripted model makes in a real opencode, each result read from the stored tool part.
// The raw results go to target/conformance-opencode.json, which tests/host/conformance.rs
// normalises and compares with `boxd-host call` and the MCP server; the facts every host
// must show are also checked here, so this suite stands on its own. A step with "host"
// runs on the bridge's plugin module (index.js) set up as scenario `hosts` names it —
// other options, a copy of the plugin built around the test-only probe component
// ($BOXD_PROBE_WASM), or a laptop opencode that fails (its `opencode` option) — called the
// way OpenCode calls a tool, without a second opencode.
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { BOXD_LOCAL, Laptop, OC_VERSION, OPENCODE, PLUGIN, REPO, copyShippedPlugin, missingPrerequisite, outputJson } from "./harness.mjs";

const SCENARIO = JSON.parse(fs.readFileSync(path.join(REPO, "tests/conformance/scenario.json"), "utf8"));
const RESULTS = path.join(REPO, "target/conformance-opencode.json");
const PROBE = process.env.BOXD_PROBE_WASM;
const skip = missingPrerequisite() ||
  (!PROBE && "BOXD_PROBE_WASM is not set (tests/host/conformance.rs sets it to the built probe component)") || false;

/** The shipped plugin in `dir`, its dist/ built around the probe component. */
function probePlugin(dir) {
  copyShippedPlugin(dir);
  execFileSync(process.execPath, [path.join(PLUGIN, "scripts/build.mjs")], {
    env: { ...process.env, BOXD_COMPONENT_WASM: PROBE, BOXD_PLUGIN_DIST: path.join(dir, "dist") },
    stdio: ["ignore", "ignore", "inherit"],
  });
  return dir;
}

/**
 * tests/conformance/opencode-that-fails.sh in `dir`, beside the real opencode and its count
 * of failures (scenario `opencodeFails`).
 */
function failingOpencode(dir, fails) {
  fs.mkdirSync(dir, { recursive: true });
  const wrapper = path.join(dir, "opencode");
  fs.copyFileSync(path.join(REPO, "tests/conformance/opencode-that-fails.sh"), wrapper);
  fs.chmodSync(wrapper, 0o755);
  fs.rmSync(path.join(dir, "real"), { force: true });
  fs.symlinkSync(OPENCODE, path.join(dir, "real"));
  fs.writeFileSync(path.join(dir, "fails"), String(fails));
  fs.writeFileSync(path.join(dir, "commands"), "");
  return wrapper;
}

/** The plugin's hooks for a host setup, as OpenCode would load them for this laptop. */
async function setupHooks(l, setup) {
  const dir = setup.component === "probe" ? probePlugin(path.join(l.root, "probe-plugin")) : PLUGIN;
  const { default: plugin } = await import(pathToFileURL(path.join(dir, "index.js")).href);
  const client = { _client: { get: async () => ({ data: { version: OC_VERSION } }) } };
  const laptop = setup.opencodeFails === undefined ? {} : { opencode: failingOpencode(path.join(l.root, "failing-opencode"), setup.opencodeFails) };
  return plugin.server({ directory: l.project, client }, { boxd: BOXD_LOCAL, ledgerDir: l.ledger, ...setup.options, ...laptop });
}

/** One tool call through the hooks, as OpenCode makes it; the JSON (or text) the model reads. */
async function callHook(hooks, tool, args) {
  const ctx = { sessionID: "ses_conformance", abort: new AbortController().signal, metadata() {}, async ask() {} };
  const r = await hooks.tool[tool].execute(args, ctx);
  try {
    return JSON.parse(r.output);
  } catch {
    return r.output;
  }
}

describe("the conformance scenario through the OpenCode bridge", { skip }, () => {
  let l;
  before(async () => {
    // A stale file from an earlier run must never stand in for this one.
    fs.rmSync(RESULTS, { force: true });
    l = await Laptop.start("conformance", {});
    l.seedGuestGolden();
    for (const [name, content] of Object.entries(SCENARIO.files)) fs.writeFileSync(path.join(l.project, name), content);
    fs.mkdirSync(path.join(l.project, "out"));
  });
  after(() => l?.stop());

  // A step's boxd-local fault rules (scenario `faults`), written just before it; after it,
  // every rule fired (its uses spent) and none is left for the next step.
  function armFaults(step) {
    if (step.faults) l.faults(step.faults);
  }
  function disarmFaults(step) {
    if (!step.faults) return;
    const file = path.join(l.boxdHome, "faults.json");
    const rules = JSON.parse(fs.readFileSync(file, "utf8"));
    fs.rmSync(file);
    for (const rule of rules) assert.equal(rule.times, 0, `${step.tool}: the fault ${JSON.stringify(rule)} never fired`);
  }

  /** One step: {tool, isError, value}. */
  async function runStep(step) {
    if (step.host !== undefined) {
      // The plugin module runs in this process: for the call, this laptop's environment
      // (its HOME, XDG folders and boxd-local state), as the opencode it serves has.
      const saved = Object.fromEntries(Object.keys(l.env).map((k) => [k, process.env[k]]));
      Object.assign(process.env, l.env);
      const setup = SCENARIO.hosts[step.host];
      const hooks = await setupHooks(l, setup);
      let value;
      try {
        value = await callHook(hooks, step.tool, step.args);
      } finally {
        await hooks.dispose();
        for (const [k, v] of Object.entries(saved)) {
          if (v === undefined) delete process.env[k];
          else process.env[k] = v;
        }
      }
      if (setup.opencodeFails !== undefined) {
        // The host ran the laptop's opencode as often as it fails, and imported as often as
        // the setup says.
        const dir = path.join(l.root, "failing-opencode");
        assert.equal(fs.readFileSync(path.join(dir, "fails"), "utf8").trim(), "0", `${step.tool}: the laptop's opencode was not run as often as it fails`);
        const ran = fs.readFileSync(path.join(dir, "commands"), "utf8").split("\n");
        assert.equal(ran.filter((c) => c === "import").length, setup.opencodeImports, `${step.tool}: ${ran.join(" ")}`);
      }
      return { tool: step.tool, isError: value?.error !== undefined, value };
    }
    let value;
    for (let i = 0; i < 240; i++) {
      value = outputJson(await l.callTool(step.tool, step.args));
      const until = step.until ?? {};
      if (value.error === undefined && Object.keys(until).length && Object.entries(until).every(([k, v]) => value[k] === v)) {
        await new Promise((r) => setTimeout(r, 500));
        continue;
      }
      break;
    }
    return { tool: step.tool, isError: value.error !== undefined, value };
  }

  test("every step, as the other hosts run it", { timeout: 600000 }, async () => {
    const results = [];
    for (const step of SCENARIO.steps) {
      armFaults(step);
      try {
        results.push(await runStep(step));
      } finally {
        disarmFaults(step);
      }
    }
    const v = results.map((r) => r.value);
    assert.equal(v[0].boxd.cli, "signed in");
    assert.equal(v[1].created, true, JSON.stringify(v[1]));
    assert.equal(v[2].created, false, "the second ensure is idempotent");
    assert.equal(v[4].outcome, "completed", JSON.stringify(v[4]));
    assert.equal(v[5].files[0].sha256, createHash("sha256").update("conformance input\ndone\n").digest("hex"));
    assert.deepEqual(v[6].forks.map((f) => [f.work, f.state, f.parent]), [["conf-b", "running", "conf"]], JSON.stringify(v[6]));
    assert.equal(v[8].dropped, true, JSON.stringify(v[8]));
    assert.equal(v[10].asleepBy, "boxd_sleep");
    assert.equal(v[11].error, "MACHINE_ASLEEP");
    assert.equal(v[12].action, "woken");
    assert.deepEqual(v.slice(13, 17).map((x) => x.error), ["NAME_INVALID", "WORK_UNKNOWN", "ARGS_INVALID", "PATH_REFUSED"]);
    assert.equal(v[17].dropped, true, JSON.stringify(v[17]));
    assert.equal(v[18].error, "OPTIONS_INVALID", JSON.stringify(v[18]));
    assert.equal(v[19], "not-allowed: {}: not in the host's policy (allowed: boxd, opencode, git)");
    assert.equal(v[20].error, "HOST_FAILED", JSON.stringify(v[20]));
    // A boxd CLI that is not kind: each fault answered with a code and a next step, the work untouched.
    assert.equal(v[21].created, true, JSON.stringify(v[21]));
    assert.deepEqual(v.slice(22, 28).map((x) => x.error), ["BOXD_FAILED", "BOXD_FAILED", "TIMEOUT", "BOXD_FAILED", "BOXD_FAILED", "BOXD_FAILED"], JSON.stringify(v.slice(22, 28)));
    assert.match(v[22].message, /more than 64 MiB on stdout/);
    assert.match(v[23].message, /more than 1 MiB on stderr/);
    assert.match(v[24].message, /did not answer within 5 s/);
    for (const x of v.slice(22, 28)) assert.ok(x.next, JSON.stringify(x));
    assert.equal(v[28].state, "idle", JSON.stringify(v[28]));
    assert.equal(v[29].proven, true, JSON.stringify(v[29]));
    assert.equal(v[30].dropped, true, JSON.stringify(v[30]));
    // A laptop opencode whose database stays locked, then one that loses a race twice.
    assert.equal(v[33].outcome, "completed", JSON.stringify(v[33]));
    assert.equal(v[34].error, "IMPORT_FAILED", JSON.stringify(v[34]));
    assert.match(v[34].message, /database is locked/);
    assert.equal(v[35].proven, true, JSON.stringify(v[35]));
    assert.equal(v[35].sessions.length, 1, JSON.stringify(v[35]));
    assert.equal(v[36].dropped, true, JSON.stringify(v[36]));
    fs.mkdirSync(path.dirname(RESULTS), { recursive: true });
    fs.writeFileSync(RESULTS, JSON.stringify(results, null, 1));
  });
});
