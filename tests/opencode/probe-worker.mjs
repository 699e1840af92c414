// A test-only worker: the shipped worker's sandbox (host-bridge/opencode/sandbox.js, the
// patched preview2-shim) with one job, a write with the flag the shim refuses into a
// preopen. It proves the workaround, the mode a created file gets (0600 in the ledger
// only), how an open of a missing name fails, and (job chmod-fails) what a failed chmod leaves.
// Started by harness.mjs probeWrite; never shipped.
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
  return { ok: back, mode, missing: openMissing(root, name) };
}

// How opens of names that are not there fail (the patch answers them without the shim's
// I/O thread), and that the same name is then created when asked.
function openMissing(root, name) {
  const error = (f) => {
    try {
      f();
      return "opened";
    } catch (e) {
      return String(e);
    }
  };
  const missing = {
    file: error(() => root.openAt({ symlinkFollow: false }, name, {}, { read: true })),
    inMissingFolder: error(() => root.openAt({ symlinkFollow: true }, `${name}.d/x`, {}, { read: true })),
    created: error(() => root.openAt({ symlinkFollow: false }, name, { create: true, exclusive: true }, { write: true })),
  };
  root.unlinkFileAt(name);
  return missing;
}

// The ledger's 0600 chmod failing (made to fail here: as root, as the tests run, it never
// does): how a new file's create and an existing file's open answer, and what is left.
function chmodFails(dir) {
  const [root] = sandbox()["wasi:filesystem/preopens"].getDirectories().find(([, guest]) => guest === dir) ?? [];
  fs.writeFileSync(`${dir}/existing`, "kept");
  const chmod = fs.chmodSync;
  fs.chmodSync = () => {
    throw Object.assign(new Error("EPERM: operation not permitted, chmod"), { code: "EPERM" });
  };
  const answer = (name, flags) => {
    try {
      root.openAt({ symlinkFollow: false }, name, flags, { write: true });
      return "opened";
    } catch (e) {
      return typeof e === "string" ? e : `thrown: ${e?.message ?? e}`;
    }
  };
  try {
    return {
      lock: answer("lock", { create: true, exclusive: true }),
      lockLeft: fs.existsSync(`${dir}/lock`),
      existing: answer("existing", { create: true }),
      existingLeft: fs.existsSync(`${dir}/existing`) && fs.readFileSync(`${dir}/existing`, "utf8"),
    };
  } finally {
    fs.chmodSync = chmod;
  }
}

try {
  parentPort.postMessage(workerData.job === "chmod-fails" ? chmodFails(workerData.dir) : probeWrite(workerData.dir));
} catch (e) {
  parentPort.postMessage({ error: String(e?.message ?? e) });
}
