// npm run build: turn the WASI component into what the plugin loads at run time, in dist/.
//
//   dist/boxd_component*.wasm   core modules, from `jco transpile --instantiation async`
//   dist/worker.js              worker.js + sandbox.js + the jco glue + preview2-shim, one esbuild bundle
//   dist/worker-thread.bundle.js the shim's own I/O thread (it starts it by URL next to itself)
//   dist/shimthread.js          lib/shimthread.js, which a pool worker starts that thread through
//   dist/policy.json            host-bridge/policy.json, the grants every host applies
//   dist/protocol.json          component/guest/protocol.json, the file limits (lib/frames.js)
//   dist/skills/boxd/SKILL.md   the skill, from the repo's skills/ folder
//   dist/build.json             what went in (component sha256, tool versions)
//
// After this the plugin folder needs no node_modules: the shipped plugin does no npm
// install and no build step. Component path: $BOXD_COMPONENT_WASM, else the one
// `cargo build -p boxd-host` leaves in target/wasm-component. Output folder:
// $BOXD_PLUGIN_DIST, else dist/ here (tests build a copy of the plugin around another
// component that way).
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const repo = path.resolve(here, "../..");
const dist = process.env.BOXD_PLUGIN_DIST ? path.resolve(process.env.BOXD_PLUGIN_DIST) : path.join(here, "dist");
const wasm = process.env.BOXD_COMPONENT_WASM ?? path.join(repo, "target/wasm-component/wasm32-wasip2/wasm/boxd_component.wasm");

function fail(msg) {
  console.error(`build: ${msg}`);
  process.exit(1);
}

if (!fs.existsSync(wasm)) fail(`${wasm} is missing: run \`cargo build -p boxd-host\` first (it builds the component)`);
const version = (name) => JSON.parse(fs.readFileSync(path.join(here, "node_modules", name, "package.json"), "utf8")).version;
const pkg = JSON.parse(fs.readFileSync(path.join(here, "package.json"), "utf8"));
// Build only with the pinned shim and jco: the patch in sandbox.js depends on the shim's
// internals, and jco's later glue costs ~1 ms more a call (docs/performance.md).
for (const name of ["@bytecodealliance/preview2-shim", "@bytecodealliance/jco"]) {
  const wanted = pkg.devDependencies[name];
  if (version(name) !== wanted) fail(`node_modules has ${name} ${version(name)}, package.json pins ${wanted}: run npm ci (or bash tests/bootstrap.sh)`);
}

// Build into a sibling folder and swap it in, so a failed build never leaves half a dist/.
const tmp = `${dist}.tmp-${process.pid}`;
fs.rmSync(tmp, { recursive: true, force: true });
fs.mkdirSync(tmp, { recursive: true });

const jco = path.join(path.dirname(fileURLToPath(import.meta.resolve("@bytecodealliance/jco"))), "jco.js");
execFileSync(process.execPath, [jco, "transpile", wasm, "-o", tmp, "--name", "boxd_component", "--instantiation", "async", "--quiet"], {
  stdio: ["ignore", "inherit", "inherit"],
});

const esbuild = await import("esbuild");
let shimWorker = false;
await esbuild.build({
  entryPoints: [path.join(here, "worker.js")],
  outfile: path.join(tmp, "worker.js"),
  bundle: true,
  platform: "node",
  format: "esm",
  target: "node20",
  plugins: [{
    name: "dist-glue",
    setup(b) {
      // The glue was written to tmp/ above; worker.js names it ./dist/…, so point that there.
      b.onResolve({ filter: /^\.\/dist\/boxd_component\.js$/ }, () => ({ path: path.join(tmp, "boxd_component.js") }));
      // The shim starts its I/O thread with lib/shimworker.js's Worker, which the pool can
      // end under Bun too (lib/shimworker.js says why).
      b.onResolve({ filter: /^node:worker_threads$/ }, (a) => {
        if (!a.importer.endsWith(path.join("preview2-shim", "dist", "io", "worker-io.js"))) return undefined;
        shimWorker = true;
        return { path: path.join(here, "lib/shimworker.js") };
      });
    },
  }],
  legalComments: "none",
  logLevel: "warning",
});
if (!shimWorker) {
  fs.rmSync(tmp, { recursive: true, force: true });
  fail("preview2-shim's io/worker-io.js no longer imports node:worker_threads: its I/O thread would outlive the pool's workers under Bun (lib/shimworker.js)");
}
// Inlined into worker.js; the type declarations are for TypeScript users of the glue.
for (const f of ["boxd_component.js", "boxd_component.d.ts", "interfaces"]) fs.rmSync(path.join(tmp, f), { recursive: true, force: true });

const shimDir = path.dirname(path.dirname(fileURLToPath(import.meta.resolve("@bytecodealliance/preview2-shim/instantiation"))));
fs.copyFileSync(path.join(shimDir, "io/worker-thread.bundle.js"), path.join(tmp, "worker-thread.bundle.js"));
fs.copyFileSync(path.join(here, "lib/shimthread.js"), path.join(tmp, "shimthread.js"));
fs.copyFileSync(path.join(repo, "host-bridge/policy.json"), path.join(tmp, "policy.json"));
fs.copyFileSync(path.join(repo, "component/guest/protocol.json"), path.join(tmp, "protocol.json"));
fs.cpSync(path.join(repo, "skills/boxd"), path.join(tmp, "skills/boxd"), { recursive: true });

const bytes = fs.readFileSync(wasm);
fs.writeFileSync(path.join(tmp, "build.json"), JSON.stringify({
  component: { path: path.relative(repo, wasm), sha256: createHash("sha256").update(bytes).digest("hex"), bytes: bytes.length },
  jco: version("@bytecodealliance/jco"),
  preview2Shim: version("@bytecodealliance/preview2-shim"),
  esbuild: version("esbuild"),
}, null, 2) + "\n");

fs.rmSync(dist, { recursive: true, force: true });
fs.renameSync(tmp, dist);
const size = fs.readdirSync(dist).reduce((n, f) => n + (fs.statSync(path.join(dist, f)).isFile() ? fs.statSync(path.join(dist, f)).size : 0), 0);
console.log(`build: dist/ ready (${Math.round(size / 1024)} KiB) from ${path.relative(repo, wasm)}`);
