// The component's home: one worker_threads Worker of the pool (lib/pool.js). The build
// bundles this file with the jco glue and preview2-shim into dist/worker.js; it is never
// loaded from here.
//
// Why a worker: the component's `spawn.run` import is synchronous, so a boxd CLI call of
// minutes would block whatever thread runs the component. Here it blocks only this worker.
// A child with nothing to stream runs here (lib/inworker.js: spawnSync, its own process
// group, the main thread watching for abort and the output caps). One with stdin or files
// is started by the plugin's main thread (lib/policy.js runChild, async, streaming); this
// thread posts the request and sleeps on an Atomics word until the reply is on its port
// (the synckit pattern the shim uses).
//
// Each call gets a fresh instance (as in the Rust host): a trap cannot poison the next
// call, and guest state never outlives the call. The core modules compile once per worker,
// and the next call's instance is made as soon as a call ends, so a call finds it ready.
import { parentPort, workerData, receiveMessageOnPort, MessageChannel } from "node:worker_threads";
import fs from "node:fs";
import { instantiate } from "./dist/boxd_component.js";
import { createSandbox } from "./sandbox.js";
import { REPLY, SHARED_WORDS, runInWorker, runsInWorker, threadId } from "./lib/inworker.js";
import { spawnRecord } from "./lib/audit.js";
import { partOf } from "./lib/watchdog.js";
import { closeSpareOutputs } from "./lib/outputs.js";

// No stacks: V8 records one for every Error made, and the shim makes one for each path a
// call finds missing (its stat throws ENOENT, which it turns into `no-entry`): ~50 µs each,
// measured. Nothing here reads a stack; a trap or a lost worker is reported by its message.
Error.stackTraceLimit = 0;

const sandbox = createSandbox(workerData);

const compiled = new Map();
function getCoreModule(name) {
  if (!compiled.has(name)) compiled.set(name, WebAssembly.compile(fs.readFileSync(new URL(`./${name}`, import.meta.url))));
  return compiled.get(name);
}

// The spawn RPC: the reply is posted on `replies` before the REPLY word is raised. The
// other shared words carry an abort and a cap kill (lib/inworker.js).
const shared = new Int32Array(new SharedArrayBuffer(SHARED_WORDS * 4));
const { port1: replies, port2 } = new MessageChannel();
// Set when this thread may run children itself (lib/inworker.js).
const tid = threadId();
parentPort.postMessage({ type: "ready", shared: shared.buffer, port: port2, tid }, [port2]);

let currentCall = 0;
// The current call's watchdog mark (its stem), and how many children it has run here: each
// carries a mark of its own within the call's (lib/watchdog.js partOf), taken back as the
// plugin's thread hears it was reaped, so what it left running is left alone.
let currentMark = null;
let childNo = 0;
// The current call's spawn records (lib/audit.js), from both spawn paths: they go back
// with its answer, for the audit line.
let spawns = [];
// Replies taken off the port, ever; the main thread raises REPLY once per reply it posts, so
// the two differ exactly while a reply is on its way. Neither is reset between calls.
let taken = 0;

// A child's output files that something it left in its group may still write into: watched
// by the plugin's thread (lib/outputs.js), which runs while this one is blocked in its next
// call, as it does for the children it starts itself.
const keepOnMain = (held) => parentPort.postMessage({ type: "kept", held });

/** The WIT request as the glue hands it, with its options filled in. */
function request(req) {
  return {
    program: req.program, args: req.args, stdin: req.stdin ?? null, env: req.env, cwd: req.cwd ?? null, timeoutMs: req.timeoutMs,
    stdinFiles: req.stdinFiles ?? [], stdoutFiles: req.stdoutFiles ?? [], stdoutModesFrom: req.stdoutModesFrom ?? [],
  };
}

/** boxd:plugin/spawn#run. Returns {tag:"ok"|"err", val} exactly as the WIT result. */
function run(req) {
  return runAll([req])[0];
}

/**
 * boxd:plugin/spawn#run-all: the children side by side, the results in request order.
 * At most one runs on this thread (spawnSync); the others are started by the main thread
 * (async), which posts each reply with its call and place and raises the REPLY word once per reply.
 */
function runAll(reqs) {
  const requests = reqs.map(request);
  const started = performance.now();
  // Written so a bound that is missing refuses (closed), never lets any size through.
  if (!(requests.length <= workerData.runAllMax)) {
    const why = `run-all takes at most ${workerData.runAllMax} requests at once (host-bridge/policy.json runAll.maxRequests); this one had ${requests.length}, so none ran`;
    const refused = requests.map(() => ({ tag: "err", val: { tag: "failed", val: why } }));
    for (const r of requests) spawns.push(spawnRecord(r, undefined, refused[0], 0));
    return refused;
  }
  const results = new Array(requests.length);
  const grants = new Array(requests.length);
  const took = new Array(requests.length);
  const call = currentCall;
  const here = tid ? requests.findIndex(runsInWorker) : -1;
  const posted = requests.length - (here >= 0 ? 1 : 0);
  requests.forEach((r, seq) => {
    if (seq !== here) parentPort.postMessage({ type: "spawn", call, req: r, seq });
  });
  if (here >= 0) {
    // Told, not asked: the main thread reports progress and watches the output meanwhile.
    parentPort.postMessage({ type: "spawning", call, req: requests[here] });
    const part = ++childNo;
    results[here] = runInWorker(requests[here], workerData, shared, call, partOf(currentMark, part), {
      onGrant: (g) => (grants[here] = g),
      keep: keepOnMain,
      onReaped: () => parentPort.postMessage({ type: "reaped", call, part }),
    });
    took[here] = performance.now() - started;
  }
  for (let got = 0, tries = 0; got < posted; ) {
    const m = receiveMessageOnPort(replies);
    if (m) {
      taken = (taken + 1) | 0;
      // A reply to an earlier call, one that gave up waiting for it, is dropped here.
      if (m.message.call === call) {
        results[m.message.seq] = m.message.reply;
        grants[m.message.seq] = m.message.grant;
        took[m.message.seq] = performance.now() - started;
        got++;
      }
      continue;
    }
    const raised = Atomics.load(shared, REPLY);
    if (raised === taken) {
      // Bounded: Bun's terminate() does not wake a thread blocked in Atomics.wait, so a pool
      // closed before its reply was sent would leave this worker (and the shim's thread)
      // waiting for ever. Woken, the loop runs JS again, and there the termination lands.
      Atomics.wait(shared, REPLY, raised, 100);
      continue;
    }
    // The word is raised after the reply is posted; allow a moment for it to show on the port.
    if (++tries > 1000) break;
    Atomics.wait(shared, REPLY, raised, 10);
  }
  const answers = results.map((r) => r ?? { tag: "err", val: { tag: "failed", val: "the host did not answer the spawn request" } });
  requests.forEach((r, i) => spawns.push(spawnRecord(r, grants[i], answers[i], took[i] ?? performance.now() - started)));
  return answers;
}

/** `run` as the glue takes an import's result: the ok value returned, an error thrown as its payload. */
function runThrowing(req) {
  const r = run(req);
  if (r.tag === "err") throw { payload: r.val };
  return r.val;
}

/** A fresh instance that can reach only the granted imports. */
async function fresh() {
  // Of everything the shim offers we pass on only the two filesystem interfaces, so a
  // component asking for more fails to instantiate, as with the Rust host's linker.
  const offered = sandbox();
  const imports = {
    "wasi:filesystem/types": offered["wasi:filesystem/types"],
    "wasi:filesystem/preopens": offered["wasi:filesystem/preopens"],
    "boxd:plugin/spawn": { run: runThrowing, runAll },
  };
  return (await instantiate(getCoreModule, imports)).tools;
}

// The instance the next call takes: made while the worker waits, never used twice.
let ready = null;
function prepareNext() {
  if (ready) return; // one is waiting already
  ready = fresh();
  ready.catch(() => {}); // a failure is retried by the call that takes it
}
function take() {
  const made = ready ?? fresh();
  ready = null;
  return made.catch(() => fresh());
}
prepareNext();

parentPort.on("message", async (m) => {
  // The pool closes an idle worker: its spare output files closed here (no one else knows
  // them), then it is ended (lib/pool.js).
  if (m.type === "close") {
    closeSpareOutputs();
    return parentPort.postMessage({ type: "closed" });
  }
  currentCall = m.id;
  currentMark = m.mark ?? null;
  childNo = 0;
  spawns = [];
  const done = (r) => {
    parentPort.postMessage({ type: "done", id: m.id, ...r, spawns });
    // Made a moment later: instantiating at once delayed the answer reaching the main
    // thread by ~0.5 ms (measured). A call arriving first makes its own.
    setTimeout(prepareNext, 1);
  };
  try {
    const tools = await take();
    if (m.type === "describe") return done({ ok: tools.describe() });
    const ctx = { ...m.ctx, nowMs: BigInt(m.ctx.nowMs), entropy: new Uint8Array(m.ctx.entropy) };
    try {
      if (m.type === "check") {
        tools.check(m.tool, m.args, ctx);
        return done({ ok: "" });
      }
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
