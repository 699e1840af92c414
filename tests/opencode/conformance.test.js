// tests/conformance/scenario.json through the OpenCode bridge: every step is one tool call
// the scripted model makes in a real opencode, each result read from the stored tool part.
// The raw results go to target/conformance-opencode.json, which tests/host/conformance.rs
// normalises and compares with `boxd-host call` and the MCP server; the facts every host
// must show are also checked here, so this suite stands on its own.
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { Laptop, REPO, helperIsPlaceholder, missingPrerequisite, outputJson } from "./harness.mjs";

const SCENARIO = JSON.parse(fs.readFileSync(path.join(REPO, "tests/conformance/scenario.json"), "utf8"));
const RESULTS = path.join(REPO, "target/conformance-opencode.json");
const skip = missingPrerequisite() ?? (helperIsPlaceholder() && "component/guest/helper.py is still the placeholder");

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

  test("every step, as the other hosts run it", { timeout: 600000 }, async () => {
    const results = [];
    for (const step of SCENARIO.steps) {
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
      results.push({ tool: step.tool, isError: value.error !== undefined, value });
    }
    const v = results.map((r) => r.value);
    assert.equal(v[0].boxd.cli, "signed in");
    assert.equal(v[1].created, true, JSON.stringify(v[1]));
    assert.equal(v[2].created, false, "the second ensure is idempotent");
    assert.equal(v[4].outcome, "completed", JSON.stringify(v[4]));
    assert.equal(v[5].files[0].sha256, createHash("sha256").update("conformance input\ndone\n").digest("hex"));
    assert.equal(v[7].asleepBy, "boxd_sleep");
    assert.equal(v[8].error, "MACHINE_ASLEEP");
    assert.equal(v[9].action, "woken");
    assert.deepEqual(v.slice(10, 14).map((x) => x.error), ["NAME_INVALID", "WORK_UNKNOWN", "ARGS_INVALID", "PATH_REFUSED"]);
    assert.equal(v[14].dropped, true, JSON.stringify(v[14]));
    fs.mkdirSync(path.dirname(RESULTS), { recursive: true });
    fs.writeFileSync(RESULTS, JSON.stringify(results, null, 1));
  });
});
