// The default permission rules the plugin adds in OpenCode's `config` hook.
//
// How OpenCode evaluates (read in the opencode-ai 1.18.33 bundle): every agent's
// ruleset is OpenCode's defaults (which start with permission "*" pattern "*" → allow,
// except explore/compaction/title/summary, which add "*" → deny), then the global
// `permission`, then `agent.<name>.permission`, each object flattened in key order; the
// LAST matching rule wins. `permission: "allow"` is shorthand for {"*": "allow"}.
//
// So a rule inserted right after a base allow ("*" → allow) overrides nothing the user
// wrote (the base allow already did), and every rule the user wrote after it still wins.
// That is the only place we insert. Per agent:
//   - its own permission has a base rule: allow → insert after it; ask/deny → leave the
//     agent alone and report it (agentsWithoutRules);
//   - else the global permission has a base rule: allow → insert after it (once);
//     ask/deny → report the agent;
//   - else the agent's base is OpenCode's own default: allow for build/plan/general and
//     custom agents → add the per-tool rules at the front of the agent's permission, but
//     only for tools the global permission does not name, so the user's global rule keeps
//     deciding; deny for explore/compaction/title/summary → report it.
//
// The rules: "boxd_*" → allow, every tool → allow, except the change tools: "deny" under
// access "read-only" (OpenCode then does not offer them to the model at all), and "ask"
// under "ask-changes" (a base allow would otherwise answer the plugin's own ctx.ask
// before the user saw it).
//
// At a call, the bridge reads the rules back as OpenCode evaluates them (GET /agent, every
// agent's merged ruleset) to tell the component what the calling agent may do and which
// agents lack the rules: see `toolRules` and `lacksRules` below.

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

export const BUILTIN_AGENTS = ["build", "plan", "general"];
const BUILTIN_DENY_ALL = ["explore", "compaction", "title", "summary"];

export function defaultRules(tools, access) {
  const rules = { "boxd_*": "allow" };
  const change = { "read-only": "deny", "ask-changes": "ask" }[access] ?? "allow";
  for (const t of tools) rules[t.name] = t.access === "change" ? change : "allow";
  return rules;
}

// A ruleset as GET /agent shows it: [{permission, pattern, action}], the last match wins.
const lastRule = (ruleset, tool, pattern) =>
  (Array.isArray(ruleset) ? ruleset : []).findLast((r) => wildcardMatch(r.permission, tool) && (pattern === undefined || wildcardMatch(r.pattern, pattern)));

/**
 * Each tool's rule for one agent, as OpenCode decides it: the action for any work (pattern
 * "*"; no rule is "ask"), and whether OpenCode hides the tool from the model (the last
 * rule naming it denies pattern "*").
 */
export function toolRules(ruleset, tools) {
  return tools.map((t) => {
    const last = lastRule(ruleset, t.name);
    return {
      tool: t.name,
      action: lastRule(ruleset, t.name, "*")?.action ?? "ask",
      hidden: last?.pattern === "*" && last?.action === "deny",
    };
  });
}

/**
 * Whether an agent lacks the default rules: for some tool, a rule that names no boxd tool
 * (its base "*", another wildcard) decides otherwise than the default would. A rule the
 * user wrote for a boxd tool is their choice, not a missing rule.
 */
export function lacksRules(ruleset, tools, access) {
  const wanted = defaultRules(tools, access);
  return tools.some((t) => {
    const r = lastRule(ruleset, t.name, "*");
    if (r && (r.permission === t.name || r.permission.startsWith("boxd_"))) return false;
    return (r?.action ?? "ask") !== wanted[t.name];
  });
}

/** The action of a permission value's base rule (permission "*", pattern "*"), or undefined. */
export function baseAction(perm) {
  if (typeof perm === "string") return perm;
  if (!isObject(perm) || !Object.hasOwn(perm, "*")) return undefined;
  const v = perm["*"];
  if (typeof v === "string") return v;
  if (isObject(v) && typeof v["*"] === "string") return v["*"];
  return undefined;
}

/** OpenCode's wildcard: `*` any run of characters, `?` one; the whole name must match. */
export function wildcardMatch(pattern, name) {
  const re = pattern.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
  return new RegExp(`^${re}$`, "s").test(name);
}

/**
 * `perm` (which has a base rule) with `rules` right after that rule. A key the user wrote
 * after the base keeps its place and value (it wins); one written before the base was
 * already overridden by it, so ours takes its place.
 */
export function insertAfterBase(perm, rules) {
  if (typeof perm === "string") return { "*": perm, ...rules };
  const keys = Object.keys(perm);
  const after = new Set(keys.slice(keys.indexOf("*") + 1));
  const out = {};
  for (const k of keys) {
    if (k !== "*" && !after.has(k) && Object.hasOwn(rules, k)) continue;
    out[k] = perm[k];
    if (k === "*") for (const [rk, rv] of Object.entries(rules)) if (!after.has(rk)) out[rk] = rv;
  }
  return out;
}

/**
 * For an agent whose base is OpenCode's default allow: the per-tool rules first, then the
 * agent's own. Agent rules come after the global ones, so a tool the global permission
 * names (even by a wildcard) is left out, and so is our own wildcard.
 */
export function prependRules(perm, rules, globalPerm) {
  const globalKeys = isObject(globalPerm) ? Object.keys(globalPerm) : [];
  const own = isObject(perm) ? perm : {};
  const out = {};
  for (const [k, v] of Object.entries(rules)) {
    if (k.includes("*") || Object.hasOwn(own, k) || globalKeys.some((g) => wildcardMatch(g, k))) continue;
    out[k] = v;
  }
  return { ...out, ...own };
}

/**
 * Add the rules to the live config object the hook receives. Returns the agents left
 * without rules and whether anything failed (RULES_NOT_ADDED).
 */
export function addDefaultRules(cfg, tools, access) {
  const rules = defaultRules(tools, access);
  const agentsWithoutRules = [];
  const global = cfg.permission;
  const globalBase = baseAction(global);
  let globalDone = false;
  const expected = []; // [read back, keys that must be there]
  const agents = isObject(cfg.agent) ? cfg.agent : {};
  const names = [...new Set([...Object.keys(agents), ...BUILTIN_AGENTS])];
  try {
    for (const name of names) {
      const agent = agents[name];
      if (agent !== undefined && !isObject(agent)) continue;
      if (agent?.disable) continue;
      const own = baseAction(agent?.permission);
      if (own !== undefined) {
        if (own !== "allow") {
          agentsWithoutRules.push(name);
          continue;
        }
        agent.permission = insertAfterBase(agent.permission, rules);
        expected.push([() => agent.permission, Object.keys(rules)]);
      } else if (globalBase !== undefined) {
        if (globalBase !== "allow") {
          agentsWithoutRules.push(name);
          continue;
        }
        if (!globalDone) {
          cfg.permission = insertAfterBase(global, rules);
          expected.push([() => cfg.permission, Object.keys(rules)]);
          globalDone = true;
        }
      } else if (BUILTIN_DENY_ALL.includes(name)) {
        agentsWithoutRules.push(name);
      } else {
        if (!isObject(cfg.agent)) cfg.agent = {};
        const target = (cfg.agent[name] ??= {});
        const next = prependRules(target.permission, rules, global);
        target.permission = next;
        expected.push([() => cfg.agent[name].permission, Object.keys(next)]);
      }
    }
    // Read back: a frozen or proxied config may swallow an assignment.
    const ok = expected.every(([get, keys]) => {
      const p = get();
      return isObject(p) && keys.every((k) => Object.hasOwn(p, k));
    });
    return { agentsWithoutRules, rulesNotAdded: !ok };
  } catch {
    return { agentsWithoutRules, rulesNotAdded: true };
  }
}
