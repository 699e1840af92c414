// preview2-shim's I/O thread as a pool worker starts it (lib/shimworker.js; the build puts
// this file in dist/, next to the shim's thread): the shim's own code, ended when the pool
// raises `shimEnding`, once the worker it serves has exited (lib/pool.js); not before, as
// that worker may be waiting on its answer.
import { workerData } from "node:worker_threads";

const ending = new Int32Array(workerData.shimEnding);
// Waited on asynchronously: this thread's event loop goes on serving the shim meanwhile.
// A runtime without waitAsync (both we run have it) gets the shim's thread as it was,
// never a thread that died before the shim could answer its worker.
if (typeof Atomics.waitAsync === "function") Promise.resolve(Atomics.waitAsync(ending, 0, 0).value).then(() => process.exit(0));
await import(workerData.shimEntry);
