// The plugin as a user installs it: `npm pack` in host-bridge/opencode, that tarball named in
// an isolated OpenCode's opencode.json as `opencode-boxd@file:/abs/opencode-boxd-X.tgz` (an
// npm spec: OpenCode 1.18 installs it with its own npm into $XDG_CACHE_HOME/opencode/packages/),
// and boxd_status run through it by the scripted model. The checkout's plugin folder is named
// nowhere in the config; the skill's location proves which copy answered.
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Laptop, PLUGIN, REPO, missingPrerequisite, outputJson } from "./harness.mjs";

const skip = missingPrerequisite() ?? false;
const T = { timeout: 180000 };
const pkg = JSON.parse(fs.readFileSync(path.join(PLUGIN, "package.json"), "utf8"));

/** Every file under `dir`, as paths relative to `base`. */
const filesUnder = (dir, base) => fs.readdirSync(dir, { recursive: true, withFileTypes: true }).filter((e) => e.isFile()).map((e) => path.relative(base, path.join(e.parentPath, e.name)));

describe("the packed plugin, installed into OpenCode from its tarball", { skip }, () => {
  let out;
  let packed;
  let l;
  before(async () => {
    out = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "oc-boxd-pack-")));
    // --ignore-scripts: prepack is `npm run build`, which the runner (tests/host/install.rs)
    // has just run through the same script; building again here would swap dist/ under the
    // bridge suites running beside this one.
    const report = JSON.parse(execFileSync("npm", ["pack", "--json", "--ignore-scripts", "--pack-destination", out], { cwd: PLUGIN, encoding: "utf8" }));
    packed = report[0];
    l = await Laptop.start("pack", { pluginDir: `${pkg.name}@file:${path.join(out, packed.filename)}` });
  });
  after(() => {
    l?.stop();
    if (out) fs.rmSync(out, { recursive: true, force: true });
  });

  test("the tarball holds everything the plugin loads, and installs with no build and no dependency", () => {
    const inTarball = new Set(packed.files.map((f) => f.path));
    const loaded = ["package.json", "index.js", ...filesUnder(path.join(PLUGIN, "lib"), PLUGIN), ...filesUnder(path.join(PLUGIN, "dist"), PLUGIN)];
    for (const f of ["dist/worker.js", "dist/worker-thread.bundle.js", "dist/shimthread.js", "dist/boxd_component.core.wasm", "dist/policy.json", "dist/protocol.json", "dist/skills/boxd/SKILL.md"]) {
      assert.ok(loaded.includes(f), `dist/ has ${f}`);
    }
    assert.deepEqual(loaded.filter((f) => !inTarball.has(f)), [], "files the plugin loads but the tarball lacks");
    for (const hook of ["preinstall", "install", "postinstall", "prepare"]) assert.equal(pkg.scripts?.[hook], undefined, `no ${hook} script`);
    assert.deepEqual(Object.keys(pkg.dependencies ?? {}), [], "dist/ bundles what the plugin needs");
  });

  test("OpenCode installs the tarball and the model's boxd_status runs through that copy", T, async () => {
    const status = outputJson(await l.callTool("boxd_status", {}));
    assert.equal(status.boxd.cli, "signed in");
    assert.equal(status.host.name, "opencode");
    assert.equal(status.skills.ok, true);
    // The installed copy: OpenCode's npm put it in the cache with nothing beside it.
    const installed = path.join(l.env.XDG_CACHE_HOME, "opencode/packages", `${pkg.name}@file:${path.join(out, packed.filename)}`, "node_modules");
    assert.deepEqual(fs.readdirSync(installed).filter((n) => !n.startsWith(".")), [pkg.name]);
    assert.equal(JSON.parse(fs.readFileSync(path.join(installed, pkg.name, "package.json"), "utf8")).version, pkg.version);
    // The skill the plugin registered from its own folder (index.js SKILLS) lies in that copy.
    const skills = await l.get("/skill");
    const boxd = skills.find((s) => s.name === "boxd");
    assert.ok(boxd, JSON.stringify(skills.map((s) => s.name)));
    assert.equal(boxd.location, path.join(installed, pkg.name, "dist/skills/boxd/SKILL.md"));
    assert.ok(!boxd.location.startsWith(REPO), boxd.location);
  });
});
