// Many writers through the OpenCode bridge's worker pool (issue 13): three submits at once
// on one work, with the real component, boxd-local and a real guest, record every
// admitted prompt exactly once — the ledger's lock lives in the component, so this host
// gets it as boxd-host does. Then two hosts at once: the pool and boxd-host processes
// submitting to one ledger together.
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { execFile } from "node:child_process";
import { BOXD_HOST, BOXD_LOCAL, Laptop, OPENCODE, PLUGIN, missingPrerequisite } from "./harness.mjs";

const built = fs.existsSync(path.join(PLUGIN, "dist/worker.js"));
const skip = missingPrerequisite() ?? (built ? false : "host-bridge/opencode/dist is missing: run npm run build there");
const noHost = fs.existsSync(BOXD_HOST) ? false : `${BOXD_HOST} is missing: cargo build -p boxd-host`;

describe("the ledger through the worker pool", { skip }, () => {
  let l, pool, g;
  before(async () => {
    l = await Laptop.start("ledger", {});
    l.seedGuestGolden();
    const policy = await import(path.join(PLUGIN, "lib/policy.js"));
    const { Pool } = await import(path.join(PLUGIN, "lib/pool.js"));
    g = policy.resolveGrants({ options: l.options, directory: l.project, env: l.env });
    pool = new Pool(g);
  });
  after(() => {
    pool?.close();
    l?.stop();
  });

  // A fresh context per call, as the plugin makes one: its own entropy.
  const ctx = () => ({
    hostName: "opencode", hostVersion: "1.18.33", optionsJson: JSON.stringify(g.componentOptions), project: g.project, ledger: g.ledger,
    nowMs: Date.now(), entropy: new Uint8Array(randomBytes(32)), approved: true, opencodeVersion: "1.18.33",
  });

  test("three submits at once record every admitted prompt exactly once", { timeout: 300000 }, async () => {
    const ensured = await pool.call("boxd_ensure", '{"work":"w1"}', ctx());
    assert.ok(ensured.ok, JSON.stringify(ensured));
    const answers = await Promise.all([0, 1, 2].map((i) => pool.call("boxd_submit", JSON.stringify({ work: "w1", prompt: `writer ${i}` }), ctx())));
    const ids = answers.map((a) => {
      assert.ok(a.ok, JSON.stringify(a));
      return JSON.parse(a.ok).promptId;
    });
    assert.ok(pool.size >= 2, "the calls ran in more than one worker");
    const record = JSON.parse(fs.readFileSync(path.join(g.ledger, "works/w1/work.json"), "utf8"));
    assert.deepEqual(record.prompts.map((p) => p.id).sort(), [...ids].sort());
    assert.ok(record.prompts.every((p) => p.admitted), JSON.stringify(record.prompts));
    const names = fs.readdirSync(path.join(g.ledger, "works/w1"));
    assert.ok(!names.some((n) => n === "lock" || n.endsWith(".boxd-tmp")), names.join(", "));
  });

  test("the bridge and boxd-host submitting at once to one ledger record every prompt once", { timeout: 300000, skip: noHost }, async () => {
    const before = JSON.parse(fs.readFileSync(path.join(g.ledger, "works/w1/work.json"), "utf8")).prompts.length;
    const viaHost = (i) =>
      new Promise((resolve) => {
        const args = ["--project", g.project, "--ledger", g.ledger, "--boxd", BOXD_LOCAL, "--opencode", OPENCODE, "call", "boxd_submit", JSON.stringify({ work: "w1", prompt: `host writer ${i}` })];
        execFile(BOXD_HOST, args, { env: l.env, encoding: "utf8", timeout: 240000 }, (err, stdout, stderr) => resolve({ code: err ? err.code : 0, stdout, stderr }));
      });
    const [hostAnswers, poolAnswers] = await Promise.all([
      Promise.all([0, 1].map(viaHost)),
      Promise.all([0, 1].map((i) => pool.call("boxd_submit", JSON.stringify({ work: "w1", prompt: `pool writer ${i}` }), ctx()))),
    ]);
    const ids = [
      ...hostAnswers.map((a) => {
        assert.equal(a.code, 0, a.stdout + a.stderr);
        return JSON.parse(a.stdout).promptId;
      }),
      ...poolAnswers.map((a) => {
        assert.ok(a.ok, JSON.stringify(a));
        return JSON.parse(a.ok).promptId;
      }),
    ];
    assert.equal(new Set(ids).size, 4, ids.join(", "));
    const record = JSON.parse(fs.readFileSync(path.join(g.ledger, "works/w1/work.json"), "utf8"));
    assert.equal(record.prompts.length, before + 4, JSON.stringify(record.prompts.map((p) => p.id)));
    for (const id of ids) assert.equal(record.prompts.filter((p) => p.id === id).length, 1, `${id} is recorded once`);
    const names = fs.readdirSync(path.join(g.ledger, "works/w1"));
    assert.ok(!names.some((n) => n === "lock" || n.endsWith(".boxd-tmp")), names.join(", "));
  });
});
