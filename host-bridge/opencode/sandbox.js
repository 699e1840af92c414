// The component's sandbox in a worker: the preview2-shim's filesystem with the policy's
// preopens and nothing else, and the patch below. Imported by worker.js, and bundled with
// it into dist/worker.js by the build (this file is not shipped on its own); the tests
// load it into a test-only worker (tests/opencode/probe-worker.mjs).
import fs from "node:fs";
import { WASIShim } from "@bytecodealliance/preview2-shim/instantiation";
import { types as shimTypes } from "@bytecodealliance/preview2-shim/filesystem";

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
//   byte. Files created elsewhere (a harvest into the project) keep the usual mode. A
//   chmod that fails answers the open `access` (ownerOnly below).
const P = shimTypes.Descriptor.prototype;
// Descriptor → the laptop path it names (preopens and what was opened from them).
const hostPaths = new WeakMap();
// The grants of this thread (one sandbox per worker: the patch is on the shim's prototype).
let granted = { preopens: [], ledger: null };
const inLedger = (p) => {
  if (!granted.ledger) return false;
  const holders = granted.preopens.filter((o) => p === o || p.startsWith(o.endsWith("/") ? o : `${o}/`));
  const longest = holders.sort((a, b) => b.length - a.length)[0];
  return longest === granted.ledger;
};
if (!P.__boxdPatched) {
  const openAt = P.openAt;
  P.openAt = function (pathFlags, path, openFlags, descriptorFlags) {
    let type;
    let missing = false;
    try {
      type = this.statAt(pathFlags, path).type;
    } catch (e) {
      // Nothing there and nothing to create: the open would fail the same way, and each
      // open is a round trip to the shim's I/O thread (a ledger's missing files are many).
      if (e === "no-entry" && !openFlags?.create) throw e;
      missing = e === "no-entry";
    }
    if (type !== undefined && !["regular-file", "directory", "symbolic-link"].includes(type)) throw "access";
    const fd = openAt.call(this, pathFlags, path, openFlags, { ...descriptorFlags, mutateDirectory: false });
    const base = hostPaths.get(this);
    if (base !== undefined) {
      const full = path === "" || path === "." ? base : `${base.replace(/\/+$/, "")}/${path}`;
      hostPaths.set(fd, full);
      if (openFlags?.create && inLedger(full)) ownerOnly(fd, full, missing || Boolean(openFlags.exclusive));
    }
    return fd;
  };
  Object.defineProperty(P, "__boxdPatched", { value: true });
}

const dispose = Symbol.dispose || Symbol.for("dispose"); // as the shim names it

/**
 * chmod 0600 the ledger file just opened with `create`. boxd-host fchmods its own
 * descriptor and ignores a failure that cannot really happen; a chmod by path can fail
 * (the name removed or replaced meanwhile, a file system that refuses modes), and a
 * ledger file left at the usual mode could be a password others read. So a failure is
 * not ignored, and not thrown either (that was a wasm trap, HOST_FAILED, leaving e.g. the
 * work's lock for the next call to wait out): the descriptor is closed, a file this open
 * `created` is removed while its name still holds it (never one that was there before),
 * and the open answers `access`, which the component reports as a refused path.
 */
function ownerOnly(fd, full, created) {
  try {
    fs.chmodSync(full, 0o600);
    return;
  } catch {}
  try {
    if (created && fs.lstatSync(full, { bigint: true }).ino === fd.metadataHash().lower) fs.unlinkSync(full);
  } catch {}
  try {
    fd[dispose]();
  } catch {}
  throw "access";
}

/**
 * The sandbox of this thread's grants ({preopens, ledger}): a function that makes the
 * shim's interfaces for one instance — the preopens, no env, args or network.
 */
export function createSandbox({ preopens, ledger }) {
  granted = { preopens, ledger: ledger || null };
  // Guest path == host path for every preopen, as in the Rust host.
  const guestPaths = Object.fromEntries(preopens.map((p) => [p, p]));
  return () => {
    const offered = new WASIShim({ sandbox: { preopens: guestPaths, env: {}, args: [], enableNetwork: false } }).getImportObject();
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
  };
}
