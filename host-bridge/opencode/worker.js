// The component's home: one worker_threads Worker of the pool (lib/pool.js). The build
// bundles this file with the jco glue and preview2-shim into dist/worker.js; it is never
// loaded from here.
//
// Why a worker: the component's `spawn.run` import is synchronous, so a boxd CLI call of
// minutes would block whatever thread runs the component. Here it blocks only this worker.
// The child itself is started by the plugin's main thread (lib/policy.js, async, its own
// process group, killed as a group on timeout); this thread posts the request and sleeps
// on an Atomics flag until the reply is on its port (the synckit pattern the shim uses).
//
// Each call gets a fresh instance (as in the Rust host): a trap cannot poison the next
// call, and guest state never outlives the call. The core modules compile once per worker.
import { parentPort, workerData, receiveMessageOnPort, MessageChannel } from "node:worker_threads";
import fs from "node:fs";
import { WASIShim } from "@bytecodealliance/preview2-shim/instantiation";
import { types as shimTypes } from "@bytecodealliance/preview2-shim/filesystem";
import { instantiate } from "./dist/boxd_component.js";

// preview2-shim 0.26.1 refuses an open whose descriptor flags carry `mutateDirectory`
// (it throws "unsupported"), and wasi-libc sets that flag on every open for writing, so a
// std-built guest cannot write a file (toolchain notes §5 and Appendix A). Our no_std
// component opens through wasi:filesystem itself and does not send the flag today; strip
// it anyway so a future guest built differently still writes its ledger. This depends on
// the shim's internals: the build refuses any shim but the pinned one.
//
// Two more rules live in the same patch, as in the Rust host (host-bridge/src/audit.rs):
// - Only regular files and folders are opened. Opening a FIFO blocks until a writer comes
//   (in the shim's I/O thread, so the call would never return), a device may never end, a
//   socket cannot be opened: the patch looks first (statAt, confined like the open) and
//   refuses with `access`.
// - A file created in the ledger is owner-only (it may be a work's server password): WASI
//   cannot set modes, so the host chmods it to 0600 before the component has written a
//   byte. Files created elsewhere (a harvest into the project) keep the usual mode.
const P = shimTypes.Descriptor.prototype;
// Descriptor → the laptop path it names (preopens and what was opened from them).
const hostPaths = new WeakMap();
const ledgerRoot = workerData.ledger || null;
const inLedger = (p) => {
  if (!ledgerRoot) return false;
  const holders = workerData.preopens.filter((o) => p === o || p.startsWith(o.endsWith("/") ? o : `${o}/`));
  const longest = holders.sort((a, b) => b.length - a.length)[0];
  return longest === ledgerRoot;
};
if (!P.__boxdPatched) {
  const openAt = P.openAt;
  P.openAt = function (pathFlags, path, openFlags, descriptorFlags) {
    let type;
    try {
      type = this.statAt(pathFlags, path).type;
    } catch {}
    if (type !== undefined && !["regular-file", "directory", "symbolic-link"].includes(type)) throw "access";
    const fd = openAt.call(this, pathFlags, path, openFlags, { ...descriptorFlags, mutateDirectory: false });
    const base = hostPaths.get(this);
    if (base !== undefined) {
      const full = path === "" || path === "." ? base : `${base.replace(/\/+$/, "")}/${path}`;
      hostPaths.set(fd, full);
      if (openFlags?.create && inLedger(full)) fs.chmodSync(full, 0o600);
    }
    return fd;
  };
  Object.defineProperty(P, "__boxdPatched", { value: true });
}

// Guest path == host path for every preopen, as in the Rust host.
const preopens = Object.fromEntries(workerData.preopens.map((p) => [p, p]));

const compiled = new Map();
function getCoreModule(name) {
  if (!compiled.has(name)) compiled.set(name, WebAssembly.compile(fs.readFileSync(new URL(`./${name}`, import.meta.url))));
  return compiled.get(name);
}

// The spawn RPC: the reply is posted on `replies` before the flag is raised.
const flag = new Int32Array(new SharedArrayBuffer(4));
const { port1: replies, port2 } = new MessageChannel();
parentPort.postMessage({ type: "ready", flag: flag.buffer, port: port2 }, [port2]);

let currentCall = 0;

/** boxd:plugin/spawn#run. Returns {tag:"ok"|"err", val} exactly as the WIT result. */
function run(req) {
  Atomics.store(flag, 0, 0);
  parentPort.postMessage({
    type: "spawn",
    call: currentCall,
    req: { program: req.program, args: req.args, stdin: req.stdin ?? null, env: req.env, cwd: req.cwd ?? null, timeoutMs: req.timeoutMs },
  });
  Atomics.wait(flag, 0, 0);
  // The flag is raised after the reply is posted; allow a moment for it to show on the port.
  for (let i = 0; i < 1000; i++) {
    const m = receiveMessageOnPort(replies);
    if (m) return m.message;
    Atomics.wait(flag, 0, 1, 10);
  }
  return { tag: "err", val: { tag: "failed", val: "the host did not answer the spawn request" } };
}

/** The shim's interfaces for one instance: the preopens, no env, args or network. */
function sandbox() {
  const offered = new WASIShim({ sandbox: { preopens, env: {}, args: [], enableNetwork: false } }).getImportObject();
  const pre = offered["wasi:filesystem/preopens"];
  const getDirectories = pre.getDirectories.bind(pre);
  offered["wasi:filesystem/preopens"] = {
    ...pre,
    getDirectories() {
      const dirs = getDirectories();
      for (const [fd, guest] of dirs) hostPaths.set(fd, guest);
      return dirs;
    },
  };
  return offered;
}

/** A fresh instance that can reach only the granted imports. */
async function fresh() {
  // Of everything the shim offers we pass on only the two filesystem interfaces, so a
  // component asking for more fails to instantiate, as with the Rust host's linker.
  const offered = sandbox();
  const imports = {
    "wasi:filesystem/types": offered["wasi:filesystem/types"],
    "wasi:filesystem/preopens": offered["wasi:filesystem/preopens"],
    "boxd:plugin/spawn": { run },
  };
  return (await instantiate(getCoreModule, imports)).tools;
}

// A write through this worker's patched shim with the flag the shim refuses, on a preopen
// of `dir`: the test of the workaround (tests/opencode/bridge.test.js), and of the mode a
// created file gets there (0600 in the ledger only: tests/opencode/bounds.test.js).
function probeWrite(shimFs, dir) {
  const [root] = shimFs["wasi:filesystem/preopens"].getDirectories().find(([, guest]) => guest === dir) ?? [];
  if (!root) throw new Error(`${dir} is not a preopen`);
  const name = `.boxd-probe-${process.pid}-${currentCall}`;
  const fd = root.openAt({ symlinkFollow: false }, name, { create: true, truncate: true }, { write: true, mutateDirectory: true });
  const bytes = new TextEncoder().encode("probe");
  fd.write(bytes, 0n);
  fd.syncData();
  const back = fs.readFileSync(`${dir}/${name}`, "utf8");
  const mode = fs.statSync(`${dir}/${name}`).mode & 0o777;
  root.unlinkFileAt(name);
  return { back, mode };
}

parentPort.on("message", async (m) => {
  currentCall = m.id;
  const done = (r) => parentPort.postMessage({ type: "done", id: m.id, ...r });
  try {
    if (m.type === "probe") {
      const { back, mode } = probeWrite(sandbox(), m.dir);
      return done({ ok: back, mode });
    }
    const tools = await fresh();
    if (m.type === "describe") return done({ ok: tools.describe() });
    const ctx = { ...m.ctx, nowMs: BigInt(m.ctx.nowMs), entropy: new Uint8Array(m.ctx.entropy) };
    try {
      return done({ ok: tools.call(m.tool, m.args, ctx) });
    } catch (e) {
      // A tool error is a ComponentError whose own `payload` is the WIT tool-error record.
      if (e && Object.hasOwn(e, "payload") && typeof e.payload?.code === "string") {
        return done({ toolError: { code: e.payload.code, message: e.payload.message, next: e.payload.next } });
      }
      throw e;
    }
  } catch (e) {
    done({ trap: String(e?.message ?? e) });
  }
});
