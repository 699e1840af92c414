// A test-only worker: the shipped worker's sandbox (host-bridge/opencode/sandbox.js, the
// patched preview2-shim) with one job, a write with the flag the shim refuses into a
// preopen. It proves the workaround and the mode a created file gets (0600 in the ledger
// only). Started by harness.mjs probeWrite; never shipped.
import { parentPort, workerData } from "node:worker_threads";
import fs from "node:fs";
import { createSandbox } from "../../host-bridge/opencode/sandbox.js";

const sandbox = createSandbox(workerData.grants);

function probeWrite(dir) {
  const [root] = sandbox()["wasi:filesystem/preopens"].getDirectories().find(([, guest]) => guest === dir) ?? [];
  if (!root) throw new Error(`${dir} is not a preopen`);
  const name = `.boxd-probe-${process.pid}`;
  const fd = root.openAt({ symlinkFollow: false }, name, { create: true, truncate: true }, { write: true, mutateDirectory: true });
  fd.write(new TextEncoder().encode("probe"), 0n);
  fd.syncData();
  const back = fs.readFileSync(`${dir}/${name}`, "utf8");
  const mode = fs.statSync(`${dir}/${name}`).mode & 0o777;
  root.unlinkFileAt(name);
  return { ok: back, mode };
}

try {
  parentPort.postMessage(probeWrite(workerData.dir));
} catch (e) {
  parentPort.postMessage({ error: String(e?.message ?? e) });
}
