// A test-only plugin process for bun.test.js, run inside OpenCode's own runtime (Bun:
// `BUN_BE_BUN=1 opencode bun-pool.mjs SCENARIO DIR`): the real pool and dist/ make one
// boxd_status call whose boxd CLI is DIR/boxd (a script the test wrote, noting its pids
// in DIR/pids). It prints one JSON line, {runtime, answer}, then exits; the node test
// looks at the pids. Scenarios: abort (abort once both children noted their pids), capped and timeout
// (wait for the answer, at most 30 s), exit (process.exit while the children run), kept (a
// second call made once the first is answered, with DIR/slow there: the answer carries
// `goneMs`, how long after the first answer the process its CLI noted in DIR/pids was
// gone, and `busy`, whether the second call was still running then). Never shipped.
import fs from "node:fs";
import path from "node:path";

const [scenario, dir] = process.argv.slice(2);
const PLUGIN = path.resolve(path.dirname(new URL(import.meta.url).pathname), "../../host-bridge/opencode");
const policy = await import(path.join(PLUGIN, "lib/policy.js"));
const { gone } = await import(new URL("./harness.mjs", import.meta.url).pathname);
const { Pool } = await import(path.join(PLUGIN, "lib/pool.js"));

const options = { boxd: path.join(dir, "boxd"), ledgerDir: path.join(dir, "ledger") };
if (scenario === "timeout") options.boxdTimeoutSeconds = 5; // the least it takes
if (scenario === "capped") options.boxdTimeoutSeconds = 60;
fs.mkdirSync(path.join(dir, "proj"), { recursive: true });
const g = policy.resolveGrants({ options, directory: path.join(dir, "proj"), env: { PATH: process.env.PATH, HOME: dir } });
const ctx = {
  hostName: "opencode", hostVersion: "1.18.33", optionsJson: JSON.stringify(g.componentOptions), project: g.project, ledger: g.ledger,
  nowMs: Date.now(), entropy: new Uint8Array(32).fill(7), approved: true, opencodeVersion: "1.18.33",
  opencode: { agentsWithoutRules: [], defaultRulesJson: "{}", toolRules: [], rulesNotAdded: false },
};
const pids = path.join(dir, "pids");
const noted = (n) => fs.existsSync(pids) && fs.readFileSync(pids, "utf8").trim().split(/\s+/).length >= n;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const pool = new Pool(g);
const abort = new AbortController();
const answer = pool.call("boxd_status", "{}", ctx, abort.signal);
const say = (a) => console.log(JSON.stringify({ runtime: process.versions.bun ? `bun ${process.versions.bun}` : "node", answer: a }));
if (scenario === "exit") {
  while (!noted(4)) await sleep(20);
  process.exit(0); // no close(): the host going away is all the plugin hears
}
if (scenario === "abort") {
  while (!noted(4)) await sleep(20);
  abort.abort();
}
if (scenario === "kept") {
  const first = await Promise.race([answer, sleep(30000).then(() => "no answer within 30 s")]);
  const t0 = performance.now();
  fs.writeFileSync(path.join(dir, "slow"), "");
  let answered = false;
  const second = pool.call("boxd_status", "{}", ctx).then((a) => ((answered = true), a));
  const left = Number(fs.readFileSync(pids, "utf8").trim().split(/\s+/)[0]);
  while (!gone(left) && performance.now() - t0 < 20000) await sleep(20);
  const result = { first, goneMs: gone(left) ? Math.round(performance.now() - t0) : null, busy: !answered };
  await second;
  say(result);
  pool.close();
  process.exit(0);
}
// Bounded: a child that outlives its kill would hold the answer for ever.
say(await Promise.race([answer, sleep(30000).then(() => "no answer within 30 s")]));
pool.close();
process.exit(0);
