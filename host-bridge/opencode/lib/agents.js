// What the user's OpenCode lets each agent do with the boxd tools, for boxd_status and for
// deciding when a call may prompt. The config hook sees only the config files; GET /agent
// shows every agent OpenCode runs (built-in, from files, from the config) with its rules
// merged the way OpenCode evaluates them (its defaults, the global and the agent's own
// permission, ours; the last match wins). Read through the plugin's own client, as
// lib/version.js reads the version, and only at a tool call.
import { within } from "./version.js";
import { defaultRules, lacksRules, toolRules } from "./rules.js";

/** Every agent as GET /agent lists it ({name, hidden, permission: [...]}), or undefined. */
export async function readAgents(input) {
  try {
    const r = await within(5000, input.client._client.get({ url: "/agent" }));
    return Array.isArray(r?.data) && r.data.every((a) => typeof a?.name === "string") ? r.data : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The WIT opencode-facts a call carries. `agents` is readAgents' answer (undefined when
 * the server did not answer: then only what the config hook saw is known); `fromConfig`
 * is that hook's result ({agentsWithoutRules, rulesNotAdded}).
 */
export function opencodeFacts({ agents, agent, tools, access, fromConfig, skillsInvalid }) {
  const caller = agents?.find((a) => a.name === agent);
  return {
    // Hidden agents (title, summary, compaction) never call a tool.
    agentsWithoutRules: agents
      ? agents.filter((a) => !a.hidden && lacksRules(a.permission, tools, access)).map((a) => a.name)
      : fromConfig.agentsWithoutRules,
    defaultRulesJson: JSON.stringify(defaultRules(tools, access)),
    agent: typeof agent === "string" ? agent : undefined,
    toolRules: caller ? toolRules(caller.permission, tools) : [],
    rulesNotAdded: fromConfig.rulesNotAdded,
    skillsInvalid: skillsInvalid || undefined,
  };
}

/** Whether a call of `tool` may prompt the user: unless the agent's rule is known to allow it. */
export function mayPrompt(facts, tool) {
  return facts.toolRules.find((r) => r.tool === tool)?.action !== "allow";
}
