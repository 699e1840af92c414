// A small pool of component workers (dist/worker.js). Each worker serves one call at a
// time, because a call blocks its worker while the component waits on a child; with up to
// `max` workers a second call never waits behind a slow one. Workers start on demand and
// stay for the next call (compiling the core module again costs ~50 ms; a fresh instance
// per call costs ~20 ms and is made inside the worker either way).
//
// A child with nothing to stream runs in the worker (lib/inworker.js); this thread watches
// its output and kills it on abort. One with stdin or files is started here, on the
// plugin's thread, with the async child_process API (lib/policy.js runChild), and the reply
// is handed to the waiting worker through its port and an Atomics word.
import { Worker } from "node:worker_threads";
import { ABORTED, REPLY, killChildrenOf, watchOutput } from "./inworker.js";
import { keepOutputs } from "./outputs.js";
import { runChild } from "./policy.js";
import { mark } from "./watchdog.js";

// The codes a call's children dying under an abort come back as (see #start's "done").
const DIED_UNDER_ABORT = new Set(["GUEST_FAILED", "BOXD_FAILED"]);

// The worker threads that run children, so none outlives this process (as policy.js does
// for the children started here).
const childThreads = new Set();
process.once("exit", () => {
  for (const tid of childThreads) killChildrenOf(tid);
});

export class Pool {
  #grants;
  #max;
  #workers = [];
  #queue = [];
  #next = 1;
  #closed = false;

  constructor(grants, { max = 3 } = {}) {
    this.#grants = grants;
    this.#max = max;
  }

  /** The manifest JSON string. */
  describe() {
    return this.#run({ type: "describe" });
  }

  /**
   * One tool call. Resolves to {ok: json} | {toolError: {code, message, next}} |
   * {trap: message} | {aborted: true}; never rejects.
   */
  call(tool, args, ctx, signal, onSpawn) {
    return this.#run({ type: "call", tool, args, ctx }, signal, onSpawn);
  }

  /**
   * The component's checks for a call, through reads only (the WIT `check`). Resolves to
   * {ok} when the call may go ahead, else as `call`.
   */
  check(tool, args, ctx, signal) {
    return this.#run({ type: "check", tool, args, ctx }, signal);
  }

  get size() {
    return this.#workers.length;
  }

  close() {
    this.#closed = true;
    const jobs = [...this.#workers.map((s) => s.job).filter(Boolean), ...this.#queue.splice(0)];
    // Killed before the workers end: a worker's children are found through its thread.
    for (const job of jobs) {
      for (const kill of job.kills) kill(); // no child outlives the plugin
      job.unwatch?.();
    }
    for (const s of this.#workers) {
      const job = s.job;
      s.job = null;
      // A worker ends only once the child it waits on has: one it forked just past its
      // abort check escaped the kills above. Until it has exited, its children are killed
      // as they show, the exit handler still knows its thread, and its call's mark is held.
      const sweep = job && s.tid ? setInterval(() => killChildrenOf(s.tid), 50) : null;
      sweep?.unref?.();
      s.worker.once("exit", () => {
        clearInterval(sweep);
        childThreads.delete(s.tid);
        job?.release?.();
      });
      if (job) {
        s.worker.terminate();
        continue;
      }
      // An idle worker first closes its spare output files, which only it knows (workers
      // run with trackUnmanagedFds off, below); ended when it says so, or after a second.
      s.worker.postMessage({ type: "close" });
      setTimeout(() => s.worker.terminate(), 1000).unref?.();
    }
    this.#workers = [];
    for (const job of jobs) job.resolve({ trap: "the plugin is shutting down" });
  }

  // `onSpawn(request)` hears of each child the call starts, as it starts (progress).
  #run(msg, signal, onSpawn) {
    return new Promise((resolve) => {
      // A pool closed already answers as close() answers the calls it ends.
      if (this.#closed) return resolve({ trap: "the plugin is shutting down" });
      const onAbort = () => {
        job.aborted = true;
        for (const kill of job.kills) kill();
      };
      // Once answered, the call lets go of its signal and kills: OpenCode passes one signal
      // to every call of a session run, and its abort must not reach a later call's children.
      const settle = (result) => {
        signal?.removeEventListener("abort", onAbort);
        job.kills.clear();
        resolve(result);
      };
      const job = { msg: { ...msg, id: this.#next++ }, resolve: settle, kills: new Set(), aborted: false, onSpawn };
      if (signal) {
        if (signal.aborted) return resolve({ aborted: true });
        // Abort kills the children this call is running; the component then sees them
        // die, and any further spawn of the call is refused.
        signal.addEventListener("abort", onAbort, { once: true });
      }
      this.#queue.push(job);
      this.#pump();
    });
  }

  #pump() {
    while (this.#queue.length && !this.#closed) {
      let slot = this.#workers.find((s) => !s.job);
      if (!slot) {
        if (this.#workers.length >= this.#max) return;
        slot = this.#start();
      }
      const job = this.#queue.shift();
      if (job.aborted) {
        job.resolve({ aborted: true });
        continue;
      }
      slot.job = job;
      slot.worker.ref();
      slot.ready.then(() => {
        if (slot.job !== job) return;
        if (job.aborted) {
          // Aborted while a new worker started: never posted, so no child of it ever runs.
          slot.job = null;
          slot.worker.unref();
          job.resolve({ aborted: true });
          return this.#pump();
        }
        if (slot.tid) {
          // The worker's own children: an abort marks the call (the worker refuses its
          // further spawns) and kills them; the watch kills one it missed by a moment.
          // Only while the slot is this call's: its next call's children are not ours.
          job.kills.add(() => {
            if (slot.job !== job) return;
            Atomics.store(slot.shared, ABORTED, job.msg.id);
            killChildrenOf(slot.tid);
          });
          job.unwatch = watchOutput(slot.tid, slot.shared, () => job.aborted);
          // Announced before the worker can start a child with it (lib/watchdog.js), and
          // taken back once the call's children have all been reaped: each as the worker
          // says it reaped it, the rest at the answer, or once its worker has exited.
          // describe runs no child, and starts no watchdog.
          if (job.msg.type !== "describe") {
            const guard = mark();
            job.msg.mark = guard.parts;
            job.release = guard.release;
            job.releasePart = guard.releasePart;
          }
        }
        // The call's clock is read as it reaches its worker, not when it was asked: a call
        // that waited in the queue behind slow ones would carry a past time (a submit's
        // at_ms, which another call could take for a lost prompt and retry). Its entropy
        // is fresh per call already and does not age.
        if (job.msg.ctx) job.msg.ctx = { ...job.msg.ctx, nowMs: Date.now() };
        slot.worker.postMessage(job.msg);
      });
    }
  }

  #start() {
    const { preopens, ledger, programs, programPolicies, childEnv, runAllMax } = this.#grants;
    // Raised once the worker has exited, this word ends the shim's I/O thread the worker
    // started (lib/shimworker.js), which Bun leaves running; Node has ended it already.
    const shimEnding = new Int32Array(new SharedArrayBuffer(4));
    // trackUnmanagedFds off: Node closes, at a worker's exit, every descriptor the worker
    // opened and did not close, and a child's output files kept after its answer are
    // opened there but watched and closed by this thread (lib/outputs.js keepOutputs). Node
    // would close them under this thread, or close numbers since reused by others. Bun
    // never closes them. So a worker closes its spare output files itself when the pool
    // closes (close()), and one ended mid-call leaves its few open files (its spares, its
    // call's own) open until this process exits.
    const worker = new Worker(new URL("../dist/worker.js", import.meta.url), {
      workerData: { preopens, ledger, programs, programPolicies, childEnv, runAllMax, shimEnding: shimEnding.buffer },
      trackUnmanagedFds: false,
    });
    worker.once("exit", () => {
      Atomics.store(shimEnding, 0, 1);
      Atomics.notify(shimEnding, 0);
    });
    worker.unref();
    const slot = { worker, job: null, shared: null, port: null, tid: undefined };
    slot.ready = new Promise((resolve) => (slot.onReady = resolve));
    worker.on("message", (m) => {
      if (m.type === "ready") {
        slot.shared = new Int32Array(m.shared);
        slot.port = m.port;
        slot.tid = m.tid;
        if (m.tid) childThreads.add(m.tid);
        slot.onReady();
      } else if (m.type === "spawn") {
        this.#spawn(slot, m);
      } else if (m.type === "spawning") {
        progress(slot.job, m.req);
      } else if (m.type === "kept") {
        keepOutputs(m.held);
      } else if (m.type === "closed") {
        worker.terminate();
      } else if (m.type === "reaped") {
        if (slot.job?.msg.id === m.call) slot.job.releasePart?.(m.part);
      } else if (m.type === "done" && slot.job?.msg.id === m.id) {
        const job = slot.job;
        job.unwatch?.();
        job.release?.();
        slot.job = null;
        worker.unref();
        const { type, id, ...result } = m;
        // An abort that killed the call's children ends the call as aborted where the
        // component took their deaths for a failure of the guest or the CLI (a "guest
        // killed by a signal" sent the user to rebuild a machine that is fine). An answer
        // stands: one that succeeded (a drop that removed the machine, a submit admitted)
        // and one whose own next step says what is uncertain (CREATE_UNCERTAIN, …).
        const diedUnder = job.aborted && DIED_UNDER_ABORT.has(result.toolError?.code);
        job.resolve(diedUnder ? { aborted: true, spawns: result.spawns } : result);
        this.#pump();
      }
    });
    const lost = (why) => {
      if (!this.#workers.includes(slot)) return;
      this.#workers = this.#workers.filter((s) => s !== slot);
      // Its call's children go with it (those started here for it, and its own): nothing
      // would read their answers, and once the call is answered no abort reaches them.
      for (const kill of slot.job?.kills ?? []) kill();
      childThreads.delete(slot.tid);
      slot.job?.unwatch?.();
      slot.job?.release?.();
      if (slot.job) slot.job.resolve({ trap: `the component worker stopped: ${why}` });
      slot.job = null;
      this.#pump();
    };
    worker.on("error", (e) => lost(e?.message ?? String(e)));
    worker.on("exit", (code) => lost(`exit code ${code}`));
    this.#workers.push(slot);
    return slot;
  }

  async #spawn(slot, m) {
    const job = slot.job;
    let reply;
    let grant; // the grant it matched, for the audit line (lib/audit.js)
    if (!job || job.aborted) {
      reply = { tag: "err", val: { tag: "failed", val: "the user aborted this tool call" } };
    } else {
      progress(job, m.req);
      try {
        reply = await runChild(
          m.req,
          this.#grants,
          (kill) => {
            job.kills.add(kill);
            return () => job.kills.delete(kill);
          },
          (g) => (grant = g),
        );
      } catch (e) {
        // runChild never rejects by design; if it ever did, the worker must still get an
        // answer, or it would wait for ever.
        reply = { tag: "err", val: { tag: "failed", val: `${m.req.program}: the host could not run it: ${e?.message ?? e}` } };
      }
    }
    const transfer = reply.tag === "ok" ? [reply.val.stdout.buffer, reply.val.stderr.buffer] : [];
    try {
      // The call's id goes back with the reply: a worker drops one that is not its call's.
      slot.port.postMessage({ call: m.call, seq: m.seq, reply, grant }, transfer);
    } catch (e) {
      // A reply that cannot be posted is still answered, as a failure (nothing to transfer).
      const why = `${m.req.program}: its answer could not reach the component: ${e?.message ?? e}`;
      slot.port.postMessage({ call: m.call, seq: m.seq, reply: { tag: "err", val: { tag: "failed", val: why } }, grant });
    } finally {
      // One raise per reply: a run-all waits for as many as it posted.
      Atomics.add(slot.shared, REPLY, 1);
      Atomics.notify(slot.shared, REPLY);
    }
  }
}

/** Tell the call's progress of a child it starts: a courtesy that never fails the call. */
function progress(job, req) {
  try {
    job?.onSpawn?.(req);
  } catch {}
}
