// When the plugin asks the user, in the real OpenCode (opencode-ai from tests/node_modules,
// the scripted model, boxd-local): with "access": "ask-changes" a change asks only after the
// component's checks (wit `check`) passed, so a call that cannot succeed fails without a
// prompt; and the rules as OpenCode evaluates them, read back from GET /agent.
// One `opencode serve` per suite; its tests run in order.
import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { Laptop, changeCommands, missingPrerequisite, outputJson } from "./harness.mjs";
import { defaultRules, lacksRules, toolRules } from "../../host-bridge/opencode/lib/rules.js";

const skip = missingPrerequisite() ?? false;
const T = { timeout: 180000 };
const TOOLS = [{ name: "boxd_status", access: "read" }, { name: "boxd_ensure", access: "change" }, { name: "boxd_drop", access: "change" }];
const rule = (permission, action, pattern = "*") => ({ permission, pattern, action });

describe("the rules as OpenCode evaluates them", () => {
  test("read-only denies the change tools, ask-changes asks", () => {
    assert.deepEqual(defaultRules(TOOLS, "read-only"), { "boxd_*": "allow", boxd_status: "allow", boxd_ensure: "deny", boxd_drop: "deny" });
    assert.equal(defaultRules(TOOLS, "ask-changes").boxd_ensure, "ask");
  });

  test("the last matching rule decides; a deny for every pattern hides the tool", () => {
    const ruleset = [rule("*", "allow"), rule("boxd_*", "allow"), rule("boxd_drop", "deny"), rule("boxd_ensure", "ask"), rule("boxd_ensure", "allow", "w-*")];
    assert.deepEqual(toolRules(ruleset, TOOLS), [
      { tool: "boxd_status", action: "allow", hidden: false },
      { tool: "boxd_ensure", action: "ask", hidden: false },
      { tool: "boxd_drop", action: "deny", hidden: true },
    ]);
    // With no rule at all OpenCode asks.
    assert.equal(toolRules([], TOOLS)[0].action, "ask");
  });

  test("an agent lacks the rules when a wildcard, not a boxd rule, decides otherwise", () => {
    assert.equal(lacksRules([rule("*", "allow"), rule("*", "ask")], TOOLS, "all"), true, "a base ask");
    assert.equal(lacksRules([rule("*", "allow"), rule("*", "deny")], TOOLS, "all"), true, "explore's deny");
    assert.equal(lacksRules([rule("*", "allow")], TOOLS, "all"), false, "OpenCode's default allow is enough");
    assert.equal(lacksRules([rule("*", "ask"), rule("boxd_*", "allow"), rule("boxd_drop", "deny")], TOOLS, "all"), false, "the user's own boxd rules are a choice");
    assert.equal(lacksRules([rule("*", "allow")], TOOLS, "ask-changes"), true, "a change that would not ask");
  });
});

/** One call in a new session, left to run: its part once the session is idle, and every
 * permission request seen meanwhile (a prompt would hold the session busy forever). */
async function callWithoutAnswering(l, tool, args) {
  const sid = await l.session();
  await l.promptAsync(sid, `@@tool:${tool}:${JSON.stringify(args)}@@`);
  const asked = [];
  await l.waitFor(`${tool} to finish without a prompt`, async () => {
    for (const p of await l.get("/permission")) if (p.sessionID === sid) asked.push(p);
    if (asked.length) return true;
    // prompt_async returns before the session is busy: wait for the part to finish too.
    const done = (await l.toolParts(sid, tool)).some((p) => ["completed", "error"].includes(p.state.status));
    return done && !(await l.get("/session/status"))[sid];
  });
  return { sid, asked, part: asked.length ? undefined : await l.toolPart(sid, tool) };
}

describe("in OpenCode, access ask-changes", { skip }, () => {
  let l;
  before(async () => {
    l = await Laptop.start("ask", { options: { access: "ask-changes" } });
    fs.writeFileSync(path.join(l.project, "notes.txt"), "not a folder\n");
  });
  after(() => l?.stop());

  test("a change that cannot succeed fails with its error and no permission request", T, async () => {
    const before = l.boxdCalls().length;
    for (const [tool, args, code] of [
      ["boxd_drop", { work: "nope" }, "WORK_UNKNOWN"],
      ["boxd_ensure", { work: "w1" }, "SNAPSHOT_MISSING"], // no golden image yet
      ["boxd_ensure", { work: "w1", directory: "notes.txt" }, "PATH_REFUSED"],
      ["boxd_image", { work: "w1", name: "Bad Name" }, "NAME_INVALID"],
      ["boxd_submit", { work: "nope", prompt: "hi" }, "WORK_UNKNOWN"],
    ]) {
      const { asked, part } = await callWithoutAnswering(l, tool, args);
      assert.deepEqual(asked, [], `${tool} ${JSON.stringify(args)} asked the user`);
      assert.equal(outputJson(part).error, code, `${tool} ${JSON.stringify(args)}`);
    }
    assert.deepEqual(changeCommands(l.boxdCalls().slice(before)), [], "the checks ran reads only");
    assert.ok(!fs.existsSync(path.join(l.ledger, "works/w1")), "and wrote no ledger record");
  });

  test("a change that can succeed asks; a reject runs nothing that changes anything", T, async () => {
    l.seedGolden();
    const before = l.boxdCalls().length;
    const { sid, asked } = await callWithoutAnswering(l, "boxd_ensure", { work: "w1" });
    assert.equal(asked.length, 1);
    assert.equal(asked[0].permission, "boxd_ensure");
    assert.deepEqual(asked[0].patterns, ["w1"]);
    await l.post(`/permission/${asked[0].id}/reply`, { reply: "reject" });
    await l.waitIdle(sid);
    assert.equal((await l.toolPart(sid, "boxd_ensure")).state.status, "error");
    assert.deepEqual(changeCommands(l.boxdCalls().slice(before)), [], "no boxd command that changes anything");
    assert.ok(!fs.existsSync(path.join(l.ledger, "works/w1")));
  });

  test("an approval runs the change", T, async () => {
    const { sid, asked } = await callWithoutAnswering(l, "boxd_ensure", { work: "w1" });
    assert.equal(asked.length, 1);
    await l.post(`/permission/${asked[0].id}/reply`, { reply: "once" });
    await l.waitIdle(sid);
    const out = outputJson(await l.toolPart(sid, "boxd_ensure"));
    assert.ok(!["APPROVAL_REQUIRED", "HOST_FAILED"].includes(out.error), JSON.stringify(out));
    assert.ok(l.boxdCalls().some((a) => a[0] === "machine" && a[1] === "new" && a[2] === "oc-w1"), "the machine was made");
    assert.equal(JSON.parse(fs.readFileSync(path.join(l.ledger, "works/w1/work.json"), "utf8")).machine, "oc-w1");
  });

  test("reads do not ask", T, async () => {
    const { asked, part } = await callWithoutAnswering(l, "boxd_status", {});
    assert.deepEqual(asked, []);
    const status = outputJson(part);
    assert.equal(status.access, "ask-changes");
    assert.ok(status.tools.filter((t) => t.access === "change").every((t) => t.runs === "asks" && t.rule === "ask"));
  });
});

describe("in OpenCode, ask-changes without a boxd CLI", { skip }, () => {
  let l;
  before(async () => {
    // No boxd option and none on PATH: the plugin loads, and every boxd call is BOXD_MISSING.
    l = await Laptop.start("nocli", { options: { access: "ask-changes", boxd: undefined } });
  });
  after(() => l?.stop());

  test("a change fails with BOXD_MISSING before anyone is asked", T, async () => {
    const { asked, part } = await callWithoutAnswering(l, "boxd_ensure", { work: "w1" });
    assert.deepEqual(asked, []);
    const e = outputJson(part);
    assert.equal(e.error, "BOXD_MISSING", JSON.stringify(e));
    assert.match(e.next, /Install the boxd CLI/);
  });
});
