// Argument grants, as host-bridge/src/policy/args.rs: a grant is a list of token
// patterns, one per argument — a literal, PREFIX{class}, or {rest} (last; every remaining
// argument). The classes and the refusal's words are args.rs's; the shared vectors hold
// the two to one outcome. A {path} must also land inside the call's preopens (`confined`,
// as policy.rs Policy::confined), else a granted program could read any file.
import fs from "node:fs";
import path from "node:path";

const CLASSES = {
  name: (v) => v.length <= 63 && /^[a-z][a-z0-9-]*$/.test(v) && !v.endsWith("-"),
  int: (v) => /^[0-9]{1,10}$/.test(v),
  hex: (v) => /^[0-9a-f]{1,64}$/.test(v),
  id: (v) => /^[A-Za-z0-9]{1,128}$/.test(v),
  path: (v) => v.startsWith("/") && Buffer.byteLength(v) <= 4096 && !v.split("/").includes("..") && !/[\x00-\x1f\x7f]/.test(v),
};

/** A token pattern as [literal prefix, class]; a plain literal has no class. */
function splitToken(token) {
  const m = /^(.*)\{([^{}]*)\}$/s.exec(token);
  return m ? [m[1], m[2]] : [token, undefined];
}

function tokenMatches(token, arg, confined) {
  const [prefix, cls] = splitToken(token);
  if (cls === undefined) return token === arg;
  const v = arg.slice(prefix.length);
  return arg.startsWith(prefix) && Object.hasOwn(CLASSES, cls) && CLASSES[cls](v) && (cls !== "path" || confined(v));
}

/** [how many leading arguments the grant matches, whether it matches them all]. */
function matched(grant, args, confined) {
  for (let i = 0; i < grant.args.length; i++) {
    if (grant.args[i] === "{rest}") return [args.length, true];
    if (i >= args.length || !tokenMatches(grant.args[i], args[i], confined)) return [i, false];
  }
  return [grant.args.length, args.length === grant.args.length];
}

/** An argument as a refusal shows it: plain when it is a plain word, else JSON-quoted. */
const show = (arg) => (/^[A-Za-z0-9_@%+=:,./-]+$/.test(arg) ? arg : JSON.stringify(arg));

/**
 * Where `p` leads once every symlink on it is followed (policy/args.rs `landing`). A path not
 * there yet leads where its nearest existing parent does, plus the missing names (a
 * missing bundle is then git's own error, not a refusal); a dangling or looping symlink,
 * or a name that cannot be looked at, leads nowhere (undefined).
 */
function landing(p) {
  const missing = [];
  for (let at = p; ; ) {
    try {
      return path.join(fs.realpathSync(at), ...missing);
    } catch {}
    try {
      fs.lstatSync(at);
      return undefined;
    } catch (e) {
      if (e.code !== "ENOENT" || at === "/") return undefined;
    }
    missing.unshift(path.basename(at));
    at = path.dirname(at);
  }
}

/** Whether the path `p` lands inside one of `preopens` (canonical folders). */
export const confinedTo = (preopens) => (p) => {
  const real = landing(p);
  return real !== undefined && preopens.some((o) => real === o || real.startsWith(o.endsWith("/") ? o : `${o}/`));
};

/**
 * The first grant that allows `args` ({grant}) or the refusal ({refused}) naming the
 * program, the refused arguments and the nearest grant, as args.rs `check`. `confined`
 * says whether a {path} value lands inside the call's preopens (confinedTo).
 */
export function checkArgs(program, grants, args, confined) {
  let nearest;
  for (const g of grants) {
    const [n, whole] = matched(g, args, confined);
    if (whole) return { grant: g };
    if (n > 0 && (nearest === undefined || n > nearest[0])) nearest = [n, g];
  }
  const asked = [program, ...args.map(show)].join(" ");
  const names = grants.map((g) => g.name).join(", ");
  if (nearest) return { refused: `${asked}: no grant allows these arguments; the nearest, ${program} ${nearest[1].name}, allows ${program} ${nearest[1].args.join(" ")}` };
  if (args.length) return { refused: `${asked}: no grant of ${program} starts with ${show(args[0])}; its grants: ${names}` };
  return { refused: `${asked}: no grant of ${program} takes no arguments; its grants: ${names}` };
}

/** Why a program's grants are not a valid list, as args.rs `invalid`; undefined when valid. */
export function invalidGrants(program, grants) {
  if (!grants.length) return `programs.${program}.grants is empty`;
  for (const [i, g] of grants.entries()) {
    const at = `programs.${program}.grants '${g.name}'`;
    if (typeof g.name !== "string" || !/^[a-z0-9-]+$/.test(g.name) || grants.slice(0, i).some((o) => o.name === g.name)) {
      return `${at}: a grant name is a lowercase word, given once`;
    }
    if (!g.args.length || splitToken(g.args[0])[1] !== undefined) return `${at}: the first token must be a literal`;
    for (const [j, t] of g.args.entries()) {
      if (t === "{rest}" && j + 1 !== g.args.length) return `${at}: {rest} may only be the last token`;
      const [prefix, cls] = splitToken(t);
      if (t !== "{rest}" && (/[{}]/.test(prefix) || (cls !== undefined && !Object.hasOwn(CLASSES, cls)) || t === "")) {
        return `${at}: '${t}' is not a literal, PREFIX{class} (class one of ${Object.keys(CLASSES).join(", ")}) or {rest}`;
      }
    }
  }
  return undefined;
}

