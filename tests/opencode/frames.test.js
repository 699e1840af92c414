// lib/frames.js, the bridge's half of streamed files (docs/guest.md, "Frames"): what it
// sends is what it receives, digests included; a damaged, short or extra frame keeps no
// file; symlinks, folders and paths outside the preopens are refused before any child.
import { test, describe, after } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { PassThrough, Writable } from "node:stream";
import { PLUGIN } from "./harness.mjs";

const built = fs.existsSync(path.join(PLUGIN, "dist/protocol.json"));
const frames = built ? await import(path.join(PLUGIN, "lib/frames.js")) : undefined;
const skip = built ? false : "the bridge is not built (npm run build)";

const dirs = [];
after(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});
function tmp() {
  const d = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "boxd-frames-")));
  dirs.push(d);
  return d;
}
const sha = (b) => createHash("sha256").update(b).digest("hex");

/** Everything `frames.send` writes, as one buffer, and what it reports sent. */
async function sent(bytes, files) {
  const pipe = new PassThrough();
  const chunks = [];
  pipe.on("data", (c) => chunks.push(c));
  const done = new Promise((r) => pipe.on("end", r));
  const report = await frames.send(pipe, bytes, files);
  await done;
  return { wire: Buffer.concat(chunks), report };
}

/** `wire` in a file, as a child's stdout is, and frames.receive over it. */
function received(dir, wire, paths, preopens = [dir], modesFrom = []) {
  const out = path.join(dir, `stdout-${dirs.length}-${Math.random()}`);
  fs.writeFileSync(out, wire);
  const fd = fs.openSync(out, "r");
  try {
    return frames.receive(fd, 1 << 20, paths, preopens, modesFrom);
  } finally {
    fs.closeSync(fd);
  }
}

describe("frames", { skip }, () => {
  test("files go out and come back whole, with the digests both sides computed", async () => {
    const d = tmp();
    const big = Buffer.alloc(300_000, 7);
    fs.writeFileSync(path.join(d, "a.bin"), big);
    fs.writeFileSync(path.join(d, "b.txt"), "");
    const files = frames.openOutgoing([path.join(d, "a.bin"), path.join(d, "b.txt")], [d]);
    const { wire, report } = await sent(Buffer.from('{"x":1}\n'), files);
    assert.deepEqual(report.map((f) => [f.size, f.sha256]), [[300_000n, sha(big)], [0n, sha("")]]);
    const got = received(d, wire, [path.join(d, "a.out"), path.join(d, "b.out")]);
    assert.equal(got.line.toString(), '{"x":1}\n');
    assert.deepEqual(got.files.map((f) => f.sha256), report.map((f) => f.sha256));
    assert.deepEqual(fs.readFileSync(path.join(d, "a.out")), big);
  });

  test("a received file takes the mode of the laptop file named for it; a symlink or none keeps the usual", async () => {
    const d = tmp();
    const dest = path.join(d, "secret.env");
    fs.writeFileSync(dest, "old");
    fs.chmodSync(dest, 0o740);
    fs.symlinkSync("/etc/passwd", path.join(d, "link.txt"));
    const files = frames.openOutgoing([dest, dest, dest], [d]);
    const { wire } = await sent(Buffer.from("{}\n"), files);
    const temps = ["secret.env.0123456789ab-0.boxd-tmp", ".0123456789ab-1.boxd-tmp", "link.txt.0123456789ab-2.boxd-tmp"].map((n) => path.join(d, n));
    received(d, wire, temps, [d], [dest, "", path.join(d, "link.txt")]);
    const mode = (p) => fs.statSync(p).mode & 0o7777;
    const usual = 0o666 & ~process.umask();
    assert.deepEqual(temps.map(mode), [0o640, usual, usual], "the destination's read and write bits, never its execute bit, never a symlink's target's");
  });

  test("a file changed while it is streamed stops the stream before its digest, saying so", async () => {
    const d = tmp();
    const a = path.join(d, "a.bin");
    const rewriteInPlace = () => {
      const fd = fs.openSync(a, "r+");
      fs.writeSync(fd, Buffer.alloc(200_000, "n"), 0, 200_000, 0);
      fs.closeSync(fd);
      fs.utimesSync(a, 1_000_000, 1_000_000);
    };
    const grow = () => fs.appendFileSync(a, "more");
    for (const meddle of [rewriteInPlace, grow]) {
      fs.writeFileSync(a, Buffer.alloc(200_000, "o"));
      const files = frames.openOutgoing([a], [d]);
      // A pipe that changes the file once the first bytes of its frame went out: between
      // its open and its last read, every time.
      const chunks = [];
      let once = meddle;
      const pipe = new Writable({
        write(chunk, _enc, cb) {
          chunks.push(chunk);
          if (chunks.length > 1 && once) {
            once();
            once = null;
          }
          cb();
        },
      });
      const report = await frames.send(pipe, null, files);
      assert.deepEqual([...report], []);
      assert.ok(report.changed?.includes(`${a} ${frames.CHANGED}`), report.changed);
      const out = path.join(d, "a.out");
      assert.ok(received(d, Buffer.concat([Buffer.from("{}\n"), ...chunks]), [out]).error);
      assert.ok(!fs.existsSync(out));
    }
    // Untouched, the same file goes through whole.
    fs.writeFileSync(a, Buffer.alloc(200_000, "o"));
    const { report } = await sent(null, frames.openOutgoing([a], [d]));
    assert.equal(report[0].size, 200_000n);
    assert.equal(report.changed, undefined);
  });

  test("a damaged, short or extra frame keeps no file", () => {
    const d = tmp();
    const good = `2\nhi${sha("hi")}\n`;
    const paths = [path.join(d, "x"), path.join(d, "y")];
    for (const bad of [`${good}2\nho${"0".repeat(64)}\n`, `${good}5\nhi`, good.repeat(3), `${good}x\n`]) {
      const got = received(d, Buffer.from(`{}\n${bad}`), paths);
      assert.ok(got.error, bad);
      assert.ok(!fs.existsSync(paths[0]) && !fs.existsSync(paths[1]), got.error);
    }
    assert.equal(received(d, Buffer.from(`{}\n${good}`), paths).files.length, 1);
  });

  test("symlinks, folders and paths outside the preopens are refused", () => {
    const d = tmp();
    fs.writeFileSync(path.join(d, "real"), "x");
    fs.symlinkSync(path.join(d, "real"), path.join(d, "link"));
    assert.throws(() => frames.openOutgoing([path.join(d, "link")], [d]), /cannot be streamed: .*symlink/);
    // Gone, or made a symlink, between the check and the open (the check is made to see
    // it as it was): refused in the words the component takes as the host's refusal, as
    // the Rust host words it (component/src/boxd.rs NOT_STREAMED). Before, Node's own
    // "ENOENT: …" / "ELOOP: …" came through, and the component answered BOXD_FAILED.
    const realpath = fs.realpathSync;
    fs.realpathSync = (p) => p;
    try {
      assert.throws(() => frames.openOutgoing([path.join(d, "gone")], [d]), /gone cannot be streamed: /);
      assert.throws(() => frames.openOutgoing([path.join(d, "link")], [d]), /link cannot be streamed: a symlink/);
    } finally {
      fs.realpathSync = realpath;
    }
    assert.throws(() => frames.openOutgoing([d], [d]), /not a regular file/);
    assert.throws(() => frames.openOutgoing([path.join(d, "real")], [path.join(d, "elsewhere")]), /outside/);
    assert.throws(() => frames.checkIncoming([path.join(d, "link", "x")], [d]), /cannot be received|cannot be streamed/);
    frames.checkIncoming([path.join(d, "new")], [d]);
  });

  // The landing folder checked, then swapped for a symlink to a folder outside every
  // preopen before the bytes arrive (a user or process moving folders while a harvest
  // runs): no byte lands outside, and nothing is left there.
  test("a folder swapped for a symlink after the check is caught before a byte moves", () => {
    const d = tmp();
    const [project, outside] = [path.join(d, "project"), path.join(d, "outside")];
    fs.mkdirSync(path.join(project, "out"), { recursive: true });
    fs.mkdirSync(outside);
    const dest = path.join(project, "out", "report.txt");
    frames.checkIncoming([dest], [project]);
    fs.renameSync(path.join(project, "out"), path.join(d, "moved"));
    fs.symlinkSync(outside, path.join(project, "out"));
    const got = received(d, Buffer.from(`{}\n2\nhi${sha("hi")}\n`), [dest], [project]);
    // In the Rust host's words, which the component reads as a laptop folder that changed.
    assert.match(got.error ?? "", new RegExp(`^cannot create ${dest}: .*symlink`));
    assert.deepEqual(fs.readdirSync(outside), [], "nothing written or left outside the preopen");
    // A file to send, its folder swapped the same way between the check and the open.
    fs.writeFileSync(path.join(outside, "secret"), "not the project's");
    assert.throws(() => frames.openOutgoing([path.join(project, "out", "secret")], [project]), /cannot be streamed: .*(symlink|outside)/);
    // A landing folder removed after the check: the same words.
    fs.rmSync(path.join(project, "out"));
    const gone = received(d, Buffer.from(`{}\n2\nhi${sha("hi")}\n`), [dest], [project]);
    assert.match(gone.error ?? "", new RegExp(`^cannot create ${dest}: ENOENT`));
  });
});
