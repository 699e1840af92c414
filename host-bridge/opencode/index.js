// opencode-boxd for OpenCode: the v1 plugin module. All tool logic lives in the WASI
// component (dist/); this file only maps OpenCode's hooks to the component's describe()
// and call() and back. The grants (lib/policy.js) and the worker pool (lib/pool.js) mirror
// the Rust host (host-bridge/src). Only the default export: OpenCode treats every export
// of a plugin file as a plugin, and a non-function one fails the whole file.
import { randomBytes } from "node:crypto";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { HostProblem, hostFailed, invalid, resolveGrants } from "./lib/policy.js";
import { openAuditLog } from "./lib/audit.js";
import { mayPrompt, opencodeFacts, readAgents } from "./lib/agents.js";
import { Pool } from "./lib/pool.js";
import { progressReporter } from "./lib/progress.js";
import { addDefaultRules } from "./lib/rules.js";
import { checkSkill } from "./lib/skill.js";
import { opencodeVersion } from "./lib/version.js";
import { idle as watchdogIdle } from "./lib/watchdog.js";
import { checkWorld } from "./lib/wit.js";
import { answerText } from "./lib/answer.js";

const SKILLS = fileURLToPath(new URL("./dist/skills", import.meta.url));

// A tool the manifest marks `longRunning` (it can take minutes) shows a title while it
// runs: the manifest's `progress` template with the work filled in.
function progressTitle(spec, args) {
  if (!spec.longRunning) return undefined;
  const work = typeof args.work === "string" ? args.work : "";
  return (spec.progress ?? `${spec.name}…`).replaceAll("{work}", work);
}

const STATUS_COMMAND = {
  description: "boxd status: sign-in, golden snapshot, every work and its machine, the tools, the next step",
  template:
    "Call the boxd_status tool now, with no arguments, and show the user every row of its result as it is: " +
    "the boxd CLI sign-in, the access setting, the golden snapshot, each work with its machine state and warnings, " +
    "every tool and whether it runs, asks or is denied, the agents without the default rules, and the one next step. " +
    "Call no other tool. $ARGUMENTS",
};

const pretty = answerText;

async function server(input, options) {
  options = options ?? {};
  let problem;
  let grants;
  try {
    grants = resolveGrants({ options, directory: input.directory, insideOpencode: Boolean(process.env.OPENCODE) });
  } catch (e) {
    if (!(e instanceof HostProblem)) throw e;
    // The tools still register (describe needs no grants), and every call reports this.
    problem = e;
    grants = { programs: {}, preopens: [], childEnv: {}, componentOptions: {}, project: input.directory, ledger: "" };
  }
  // Options `auditLog`: one line per tool call (lib/audit.js). A log that cannot be opened
  // stops every call, as any other bad option: the user asked for an audit.
  let auditLog;
  if (grants.auditLog) {
    try {
      auditLog = openAuditLog(grants.auditLog);
    } catch (e) {
      problem ??= invalid("auditLog", `names ${grants.auditLog}, which cannot be opened: ${e.message}`);
    }
  }
  const pool = new Pool(grants);
  const described = await pool.describe();
  if (described.ok === undefined) {
    pool.close();
    throw new Error(`opencode-boxd: the component did not describe itself (${described.trap ?? "no answer"}); rebuild the plugin with npm run build`);
  }
  const manifest = JSON.parse(described.ok);
  try {
    checkWorld(manifest);
  } catch (e) {
    pool.close();
    throw e;
  }
  const specs = new Map(manifest.tools.map((t) => [t.name, t]));
  const access = options.access ?? "all"; // an invalid value reaches the component: OPTIONS_INVALID
  const state = { agentsWithoutRules: [], rulesNotAdded: false, skillsInvalid: checkSkill(path.join(SKILLS, "boxd", "SKILL.md")) };
  let version;

  const errorResult = (tool, e, extra) => ({
    title: `${tool}: ${e.code}`,
    output: pretty({ error: e.code, message: e.message, next: e.next }),
    metadata: { error: e.code, ...extra },
  });

  // The component's answer when it is an error (a tool error or a trap), else undefined.
  const failed = (tool, r, extra) => {
    if (r.toolError) return errorResult(tool, r.toolError, extra);
    // A trap (a panic, an out-of-memory, any failure inside the component) is HOST_FAILED
    // with the one next step every host gives (policy.json hostFailed).
    if (r.trap !== undefined) return errorResult(tool, hostFailed(tool, r.trap), extra);
    return undefined;
  };

  // With an audit log, one line per tool call, however it ended: the result ("ok", or
  // {error: CODE}, or {thrown: message} when OpenCode's ask or an abort ended it) and the
  // spawn records of its check and its call.
  async function execute(spec, rawArgs, ctx) {
    if (!auditLog) return run(spec, rawArgs, ctx, []);
    const started = performance.now();
    const spawns = [];
    let result;
    try {
      const out = await run(spec, rawArgs, ctx, spawns);
      result = out.metadata?.error ? { error: out.metadata.error } : "ok";
      return out;
    } catch (e) {
      result = { thrown: String(e?.message ?? e) };
      throw e;
    } finally {
      auditLog.record(spec.name, performance.now() - started, result, spawns);
    }
  }

  async function run(spec, rawArgs, ctx, spawns) {
    const tool = spec.name;
    const args = rawArgs ?? {};
    const argsJson = JSON.stringify(args);
    const extra = state.skillsInvalid ? { skillsInvalid: state.skillsInvalid } : {};
    if (problem) return errorResult(tool, problem, extra);
    // Asked once; an "unknown" (the server did not answer) is asked again next call.
    version ??= opencodeVersion(input);
    const [hostVersion, agents] = await Promise.all([version, readAgents(input)]);
    if (hostVersion === "unknown") version = undefined;
    const opencode = opencodeFacts({ agents, agent: ctx.agent, tools: manifest.tools, access, fromConfig: state, skillsInvalid: state.skillsInvalid });
    // The WIT context (wit/plugin.wit): typed, with OpenCode's own facts grouped.
    const context = (approved) => ({
      hostName: "opencode",
      hostVersion,
      optionsJson: JSON.stringify(grants.componentOptions),
      project: grants.project,
      ledger: grants.ledger,
      nowMs: Date.now(), // read again by the pool as the call reaches its worker
      entropy: new Uint8Array(randomBytes(32)),
      approved,
      opencodeVersion: hostVersion,
      opencode,
    });
    // Before anyone may be asked, the checks that need no change (bad arguments, no boxd
    // CLI, ACCESS_DENIED, a drop that will be refused, …): a call that cannot succeed
    // fails here, without a prompt.
    if (mayPrompt(opencode, tool)) {
      const checked = await pool.check(tool, argsJson, context(false), ctx.abort);
      spawns.push(...(checked.spawns ?? []));
      if (checked.aborted) throw new Error(`${tool} was aborted`);
      const refused = failed(tool, checked, extra);
      if (refused) return refused;
    }
    // OpenCode decides with the agent's rules (and the session's): allow answers at once,
    // deny and a rejection throw (OpenCode reports them, and nothing runs), ask prompts.
    const target = typeof args.work === "string" && args.work ? args.work : "*";
    await ctx.ask({ permission: tool, patterns: [target], always: [target], metadata: { tool, work: args.work ?? null } });
    // Progress (lib/progress.js): the running part's title, at the start and at each boxd
    // (or opencode) command the call runs.
    const progress = progressTitle(spec, args);
    const reporter = progress ? progressReporter(input, ctx) : undefined;
    let steps = 0;
    const onSpawn = reporter && ((req) => {
      // The verb only ("boxd machine new", "opencode import"): never a path or a value.
      const step = [req.program, ...req.args.filter((a) => !a.startsWith("-")).slice(0, req.program === "boxd" ? 2 : 1)].join(" ");
      reporter.report(`${progress} (${step})`, { step, steps: ++steps });
    });
    reporter?.report(progress, { step: "start" });
    const r = await pool.call(tool, argsJson, context(true), ctx.abort, onSpawn);
    spawns.push(...(r.spawns ?? []));
    await reporter?.close();
    if (r.aborted) throw new Error(`${tool} was aborted`);
    const refused = failed(tool, r, extra);
    if (refused) return refused;
    let value;
    try {
      value = JSON.parse(r.ok);
    } catch {
      value = r.ok;
    }
    return {
      title: typeof args.work === "string" ? `${tool} ${args.work}` : tool,
      output: typeof value === "string" ? value : pretty(value),
      metadata: { ...(typeof args.work === "string" ? { work: args.work } : {}), ...(progress ? { step: "done", steps } : {}), ...extra },
    };
  }

  return {
    // Plain JSON-Schema properties (no zod): OpenCode sends them to the model as given and
    // validates nothing; the component checks the arguments against its own schema.
    tool: Object.fromEntries(manifest.tools.map((t) => [t.name, {
      description: t.description,
      args: t.inputSchema?.properties ?? {},
      execute: (args, ctx) => execute(t, args, ctx),
    }])),
    // OpenCode marks every plain property required; give the model the real schema instead.
    "tool.definition": async ({ toolID }, out) => {
      const t = specs.get(toolID);
      if (t?.inputSchema) out.jsonSchema = structuredClone(t.inputSchema);
    },
    config: async (cfg) => {
      if (cfg.command === undefined || cfg.command === null) cfg.command = {};
      cfg.command["boxd-status"] ??= STATUS_COMMAND;
      if (!state.skillsInvalid) {
        if (cfg.skills === undefined || cfg.skills === null) cfg.skills = {};
        cfg.skills.paths = [...(Array.isArray(cfg.skills.paths) ? cfg.skills.paths : []), SKILLS];
      }
      const r = addDefaultRules(cfg, manifest.tools, access);
      state.agentsWithoutRules = r.agentsWithoutRules;
      state.rulesNotAdded = r.rulesNotAdded;
    },
    dispose: async () => {
      pool.close();
      auditLog?.close();
      watchdogIdle();
    },
  };
}

export default { id: "opencode-boxd", server };
