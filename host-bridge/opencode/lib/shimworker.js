// The Worker preview2-shim starts its I/O thread with, in dist/worker.js: the build points
// the shim's `node:worker_threads` import (io/worker-io.js) here. Bun does not end a
// worker's own workers with it (Node does), so each pool worker ended left the shim's thread
// running, with its descriptors and ~6 MB: a long-lived `opencode serve` that disposes
// plugins piled them up. In a pool worker the thread runs through lib/shimthread.js, which
// ends it once the pool raises the word it was given (lib/pool.js: when this worker has
// exited). Bun still keeps three descriptors of every worker ended, its own (eventpoll,
// timerfd, eventfd): nothing here can close those.
import { Worker as ThreadWorker, workerData } from "node:worker_threads";

export class Worker extends ThreadWorker {
  constructor(url, options = {}) {
    const ending = workerData?.shimEnding; // none outside a pool worker: the shim's own way
    super(
      ending ? new URL("./shimthread.js", import.meta.url) : url,
      ending ? { ...options, workerData: { ...options.workerData, shimEntry: String(url), shimEnding: ending } } : options,
    );
  }
}
