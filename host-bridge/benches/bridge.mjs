// The OpenCode bridge's share of `cargo bench -p boxd-host`: boxd_status through the
// worker pool (lib/pool.js, the built dist/) against the same two boxd calls run directly.
// Status runs the two side by side (run-all), so they are also replayed side by side.
// argv: BOXD_LOCAL_BIN WORK_DIR ROUNDS. Prints one JSON line {bridgeMs, directMs, atOnceMs} (medians).
import { execFile, execFileSync } from "node:child_process";
import { promisify } from "node:util";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const plugin = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../opencode");
const [boxd, dir, rounds = "60"] = process.argv.slice(2);
const env = { PATH: process.env.PATH, HOME: dir, BOXD_LOCAL_HOME: path.join(dir, "boxd-local") };
fs.mkdirSync(path.join(dir, "proj"), { recursive: true });
fs.mkdirSync(env.BOXD_LOCAL_HOME, { recursive: true });
process.env.BOXD_LOCAL_HOME = env.BOXD_LOCAL_HOME;
const policy = await import(path.join(plugin, "lib/policy.js"));
const { Pool } = await import(path.join(plugin, "lib/pool.js"));
const g = policy.resolveGrants({ options: { boxd, ledgerDir: path.join(dir, "ledger") }, directory: path.join(dir, "proj"), env });
const pool = new Pool(g);
const ctx = () => ({
  hostName: "opencode", hostVersion: "1.18.33", optionsJson: JSON.stringify(g.componentOptions), project: g.project, ledger: g.ledger,
  nowMs: Date.now(), entropy: new Uint8Array(32).fill(7), approved: true, opencodeVersion: "1.18.33",
  opencode: { agentsWithoutRules: [], defaultRulesJson: "{}", toolRules: [], rulesNotAdded: false },
});
const median = (v) => v.sort((a, b) => a - b)[Math.floor(v.length / 2)];
async function timed(f) {
  const t = process.hrtime.bigint();
  await f();
  return Number(process.hrtime.bigint() - t) / 1e6;
}
// The worker started and its modules compiled, then ten calls for V8 to optimise the glue:
// a worker's first ~10 calls each take up to ~1 ms more (docs/performance.md).
for (let i = 0; i < 11; i++) await pool.call("boxd_status", "{}", ctx());
const listings = [["machine", "list", "--json"], ["snapshots", "list", "--json"]];
const run = promisify(execFile);
const bridge = [], direct = [], atOnce = [];
for (let i = 0; i < Number(rounds); i++) {
  bridge.push(await timed(async () => {
    const r = await pool.call("boxd_status", "{}", ctx());
    if (!r.ok) throw new Error(JSON.stringify(r));
  }));
  // Let the worker make its next instance, as it does between a model's calls.
  await new Promise((r) => setTimeout(r, 20));
  direct.push(await timed(() => {
    for (const args of listings) execFileSync(boxd, args, { env });
  }));
  atOnce.push(await timed(() => Promise.all(listings.map((args) => run(boxd, args, { env })))));
}
pool.close();
console.log(JSON.stringify({ bridgeMs: median(bridge), directMs: median(direct), atOnceMs: median(atOnce) }));
