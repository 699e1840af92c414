// A test-only worker: lib/inworker.js's runInWorker on a worker thread, as the shipped
// worker runs it, without the component, so tests can hand it any request. It posts
// {tid, shared} first, then one answer per request. Started by inworker.test.js; never shipped.
import { parentPort, workerData } from "node:worker_threads";
import { SHARED_WORDS, runInWorker, threadId } from "../../host-bridge/opencode/lib/inworker.js";

const shared = new Int32Array(new SharedArrayBuffer(SHARED_WORDS * 4));
parentPort.postMessage({ tid: threadId(), shared: shared.buffer });
parentPort.on("message", ({ req, call }) => parentPort.postMessage(runInWorker(req, workerData, shared, call)));
