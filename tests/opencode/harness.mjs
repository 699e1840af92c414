// A laptop for the OpenCode bridge tests: an isolated HOME/XDG, the scripted model, a
// project whose opencode.json loads the plugin by path with the given options, boxd-local
// as the boxd CLI with its own state folder, and a real `opencode serve` (opencode-ai from
// tests/node_modules). Everything is driven over HTTP with timeouts (a request can hang
// while the server starts, seen with opencode-ai 1.18.33), and assertions read the stored session.
import { spawn, execFileSync } from "node:child_process";
import { Worker } from "node:worker_threads";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
export const PLUGIN = path.join(REPO, "host-bridge/opencode");
export const OPENCODE = path.join(REPO, "tests/node_modules/.bin/opencode");
export const BOXD_LOCAL = process.env.BOXD_LOCAL_BIN ?? path.join(REPO, "target/debug/boxd-local");
export const BOXD_HOST = process.env.BOXD_HOST_BIN ?? path.join(path.dirname(BOXD_LOCAL), "boxd-host");
export const MODEL = path.join(REPO, "host-bridge/tour/scripted-model.mjs");
export const OC_VERSION = JSON.parse(fs.readFileSync(path.join(REPO, "tests/package.json"), "utf8")).dependencies["opencode-ai"];

/** Why the OpenCode tests cannot run here, or undefined. */
export function missingPrerequisite() {
  if (!fs.existsSync(path.join(PLUGIN, "dist/worker.js"))) return "host-bridge/opencode/dist is missing: run `npm run build` in host-bridge/opencode";
  if (!fs.existsSync(OPENCODE)) return "tests/node_modules/.bin/opencode is missing: run tests/bootstrap.sh";
  if (!fs.existsSync(BOXD_LOCAL)) return `${BOXD_LOCAL} is missing: run cargo build -p boxd-local`;
  if (!fs.existsSync(MODEL)) return "host-bridge/tour/scripted-model.mjs is missing";
  return undefined;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function waitForLine(child, re, ms, what) {
  return new Promise((resolve, reject) => {
    let seen = "";
    const timer = setTimeout(() => reject(new Error(`${what} did not start within ${ms} ms:\n${seen.slice(-2000)}`)), ms);
    const on = (chunk) => {
      seen += chunk;
      const m = re.exec(seen);
      if (m) {
        clearTimeout(timer);
        resolve(m);
      }
    };
    child.stdout.on("data", on);
    child.stderr.on("data", on);
    child.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`${what} exited (${code}) before it was ready:\n${seen.slice(-2000)}`));
    });
  });
}

// OpenCode installs @opencode-ai/plugin into every config dir unless it finds these
// (seen with opencode-ai 1.18.33); the plugin imports nothing, so an empty node_modules is enough.
function seedConfigDir(dir) {
  fs.mkdirSync(path.join(dir, "node_modules"), { recursive: true });
  fs.writeFileSync(path.join(dir, "package.json"), JSON.stringify({ dependencies: { "@opencode-ai/plugin": OC_VERSION } }));
  fs.writeFileSync(path.join(dir, "package-lock.json"), JSON.stringify({ lockfileVersion: 3, packages: { "": { dependencies: { "@opencode-ai/plugin": OC_VERSION } } } }));
}

/** The shipped plugin only: package.json's `files`, no node_modules (proves no runtime install). */
export function copyShippedPlugin(to) {
  const pkg = JSON.parse(fs.readFileSync(path.join(PLUGIN, "package.json"), "utf8"));
  fs.mkdirSync(to, { recursive: true });
  for (const f of ["package.json", ...pkg.files]) {
    const from = path.join(PLUGIN, f);
    if (fs.existsSync(from)) fs.cpSync(from, path.join(to, f), { recursive: true });
  }
  return to;
}

/** The shipped plugin in `dir`, built around the probe component (`wasm`), loaded as
 * OpenCode loads it for a project `dir`/proj with `options` added: its hooks. */
export async function probePluginHooks(dir, wasm, options = {}) {
  const plugin = copyShippedPlugin(path.join(dir, "plugin"));
  execFileSync(process.execPath, [path.join(PLUGIN, "scripts/build.mjs")], {
    env: { ...process.env, BOXD_COMPONENT_WASM: wasm, BOXD_PLUGIN_DIST: path.join(plugin, "dist") },
    stdio: ["ignore", "ignore", "inherit"],
  });
  const { default: mod } = await import(pathToFileURL(path.join(plugin, "index.js")).href);
  fs.mkdirSync(path.join(dir, "proj"));
  const client = { _client: { get: async () => ({ data: { version: "0.0.0" } }) } };
  return mod.server({ directory: path.join(dir, "proj"), client }, { boxd: "/bin/true", opencode: "/bin/true", ledgerDir: path.join(dir, "ledger"), ...options });
}

export class Laptop {
  /**
   * @param {object} o
   * @param {object} o.options   plugin options (boxd and ledgerDir are filled in)
   * @param {object} [o.config]  extra opencode.json keys (agent, permission, …)
   * @param {string} [o.pluginDir] load the plugin from here instead of the repo
   */
  static async start(name, { options = {}, config = {}, pluginDir = PLUGIN } = {}) {
    const l = new Laptop();
    l.root = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), `oc-boxd-${name}-`)));
    const d = (p) => {
      const full = path.join(l.root, p);
      fs.mkdirSync(full, { recursive: true });
      return full;
    };
    l.home = d("home");
    l.project = d("project");
    l.boxdHome = d("boxd-local");
    l.ledger = path.join(l.root, "ledger"); // the plugin creates it (0700)
    l.env = {
      PATH: `${path.dirname(OPENCODE)}:${process.env.PATH}`,
      HOME: l.home,
      LANG: "C.UTF-8",
      TMPDIR: d("tmp"),
      XDG_DATA_HOME: d("data"),
      XDG_CONFIG_HOME: d("config"),
      XDG_CACHE_HOME: d("cache"),
      XDG_STATE_HOME: d("state"),
      OPENCODE_DISABLE_MODELS_FETCH: "1",
      OPENCODE_DISABLE_AUTOUPDATE: "1",
      OPENCODE_DISABLE_EXTERNAL_SKILLS: "1",
      BOXD_LOCAL_HOME: l.boxdHome,
    };
    l.children = [];
    try {
      const model = l.#spawn(process.execPath, [MODEL], { ...l.env, PORT: "0", MODEL_LOG: path.join(l.root, "model.jsonl") }, l.root);
      const [, modelUrl] = await waitForLine(model, /listening on (http:\/\/\S+)/, 15000, "the scripted model");
      l.modelUrl = modelUrl;
      execFileSync("git", ["init", "-q"], { cwd: l.project });
      seedConfigDir(path.join(l.env.XDG_CONFIG_HOME, "opencode"));
      seedConfigDir(path.join(l.project, ".opencode"));
      l.options = { boxd: BOXD_LOCAL, ledgerDir: l.ledger, ...options };
      const oc = {
        $schema: "https://opencode.ai/config.json",
        provider: {
          scripted: {
            npm: "@ai-sdk/openai-compatible",
            name: "Scripted",
            options: { baseURL: modelUrl, apiKey: "scripted-key" },
            models: { "scripted-model": { name: "Scripted Model", tool_call: true } },
          },
        },
        model: "scripted/scripted-model",
        small_model: "scripted/scripted-model",
        autoupdate: false,
        share: "disabled",
        plugin: [[pluginDir, l.options]],
        ...config,
      };
      fs.writeFileSync(path.join(l.project, "opencode.json"), JSON.stringify(oc, null, 2));
      const serve = l.#spawn(OPENCODE, ["serve", "--hostname", "127.0.0.1", "--port", "0", "--print-logs", "--log-level", "WARN"], l.env, l.project);
      l.serveLog = "";
      serve.stdout.on("data", (c) => (l.serveLog += c));
      serve.stderr.on("data", (c) => (l.serveLog += c));
      const [, url] = await waitForLine(serve, /opencode server listening on (http:\/\/\S+)/, 60000, "opencode serve");
      l.url = url.replace(/\/$/, "");
    } catch (e) {
      l.stop();
      throw e;
    }
    return l;
  }

  #spawn(cmd, args, env, cwd) {
    const child = spawn(cmd, args, { env, cwd, stdio: ["ignore", "pipe", "pipe"], detached: true });
    child.stdout.setEncoding("utf8");
    child.stderr.setEncoding("utf8");
    this.children.push(child);
    return child;
  }

  stop() {
    // Machines first: removing one kills its processes (a guest's OpenCode server, its
    // pump), which left their exec's process group and so outlive ours.
    try {
      for (const m of JSON.parse(this.boxd("machine", "list", "--json"))) this.boxd("machine", "remove", m.name, "-y");
    } catch {}
    for (const c of this.children ?? []) {
      if (!Number.isInteger(c.pid) || c.pid <= 1) continue;
      try {
        process.kill(-c.pid, "SIGKILL"); // the whole group (started detached): serve's own children too
      } catch {}
    }
    if (!process.env.KEEP_TEST_DIRS) fs.rmSync(this.root, { recursive: true, force: true });
  }

  async http(method, route, body, ms = 30000) {
    const res = await fetch(this.url + route, {
      method,
      headers: body === undefined ? {} : { "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(ms),
    });
    const text = await res.text();
    if (!res.ok) throw new Error(`${method} ${route}: HTTP ${res.status} ${text.slice(0, 500)}`);
    return text ? JSON.parse(text) : null;
  }

  get = (route, ms) => this.http("GET", route, undefined, ms);
  post = (route, body, ms) => this.http("POST", route, body ?? {}, ms);

  async session() {
    return (await this.post("/session", { title: "boxd test" })).id;
  }

  /** One prompt, waiting for the turn to end (the first prompt on a server takes ~7 s). */
  prompt(sid, text, ms = 120000) {
    return this.post(`/session/${sid}/message`, { parts: [{ type: "text", text }] }, ms);
  }

  promptAsync(sid, text) {
    return fetch(`${this.url}/session/${sid}/prompt_async`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ parts: [{ type: "text", text }] }),
      signal: AbortSignal.timeout(30000),
    }).then((r) => {
      if (r.status !== 204 && !r.ok) throw new Error(`prompt_async: HTTP ${r.status}`);
    });
  }

  /** The tool call `@@tool:NAME:{args}@@` in a new session; returns its stored part. */
  async callTool(tool, args = {}) {
    const sid = await this.session();
    // "@" as \u0040 in the JSON: a directive inside the arguments (a prompt for the guest's
    // model) must reach the tool as text, not be taken by this laptop's model.
    await this.prompt(sid, `@@tool:${tool}:${JSON.stringify(args).replace(/@/g, "\\u0040")}@@`);
    return this.toolPart(sid, tool);
  }

  async toolParts(sid, tool) {
    const msgs = await this.get(`/session/${sid}/message`);
    return msgs.flatMap((m) => m.parts).filter((p) => p.type === "tool" && (!tool || p.tool === tool));
  }

  async toolPart(sid, tool) {
    const parts = await this.toolParts(sid, tool);
    if (parts.length !== 1) throw new Error(`expected one ${tool} part in ${sid}, found ${parts.length}\n${this.serveLog.slice(-3000)}`);
    return parts[0];
  }

  async waitFor(what, fn, ms = 60000, every = 150) {
    const end = performance.now() + ms;
    for (;;) {
      const v = await fn();
      if (v) return v;
      if (performance.now() > end) throw new Error(`timed out waiting for ${what}\n${this.serveLog.slice(-3000)}`);
      await sleep(every);
    }
  }

  /** Idle sessions are absent from /session/status. */
  waitIdle(sid, ms) {
    return this.waitFor(`session ${sid} to go idle`, async () => !(await this.get("/session/status"))[sid], ms);
  }

  boxd(...args) {
    return execFileSync(BOXD_LOCAL, args, { env: { PATH: process.env.PATH, BOXD_LOCAL_HOME: this.boxdHome }, encoding: "utf8" });
  }

  /** boxd-local's call log: each invocation's argv. */
  boxdCalls() {
    const file = path.join(this.boxdHome, "calls.jsonl");
    if (!fs.existsSync(file)) return [];
    return fs.readFileSync(file, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l).argv);
  }

  /** A golden snapshot in boxd-local, so boxd_ensure gets as far as creating a machine. */
  seedGolden(name = "opencode-golden") {
    this.boxd("machine", "new", "seed", "--json");
    this.boxd("snapshots", "save", "seed", name, "--json");
    this.boxd("machine", "remove", "seed", "-y", "--json");
  }

  /**
   * A golden image whose guests run the pinned OpenCode (from PATH, as boxd-local's
   * machines see this computer's) against the scripted model, as tests/host/common.rs
   * World::golden builds it: the guest config first, the model's address in boxd env.
   */
  seedGuestGolden(name = "opencode-golden") {
    const config = {
      $schema: "https://opencode.ai/config.json",
      provider: {
        scripted: {
          npm: "@ai-sdk/openai-compatible",
          name: "Scripted",
          options: { baseURL: "{env:SCRIPTED_MODEL_URL}", apiKey: "{env:SCRIPTED_MODEL_KEY}" },
          models: { "scripted-model": { name: "Scripted", tool_call: true } },
        },
      },
      model: "scripted/scripted-model",
      small_model: "scripted/scripted-model",
      autoupdate: false,
      share: "disabled",
    };
    const seed = [
      "mkdir -p .config/opencode/node_modules",
      "cat > .config/opencode/opencode.json",
      `printf '${JSON.stringify({ dependencies: { "@opencode-ai/plugin": OC_VERSION } })}' > .config/opencode/package.json`,
      `printf '${JSON.stringify({ lockfileVersion: 3, packages: { "": { dependencies: { "@opencode-ai/plugin": OC_VERSION } } } })}' > .config/opencode/package-lock.json`,
    ].join(" && ");
    this.boxd("machine", "new", "golden-build", "--json");
    execFileSync(BOXD_LOCAL, ["machine", "exec", "golden-build", "--", "sh", "-c", `'${seed.replace(/'/g, "'\\''")}'`], {
      env: { PATH: process.env.PATH, BOXD_LOCAL_HOME: this.boxdHome },
      input: JSON.stringify(config),
    });
    this.boxd("snapshots", "save", "golden-build", name);
    this.boxd("machine", "remove", "golden-build", "-y");
    for (const [k, v] of [["SCRIPTED_MODEL_URL", this.modelUrl], ["OPENCODE_DISABLE_MODELS_FETCH", "1"], ["OPENCODE_DISABLE_AUTOUPDATE", "1"]]) this.boxd("env", "set", k, v);
    this.boxd("env", "set", "SCRIPTED_MODEL_KEY", "test-key", "--secret");
  }

  faults(rules) {
    fs.writeFileSync(path.join(this.boxdHome, "faults.json"), JSON.stringify(rules));
  }
}

/** The JSON the tool returned to the model (output is pretty JSON, result or error). */
export function outputJson(part) {
  if (part.state?.status !== "completed") throw new Error(`tool part is ${part.state?.status}: ${JSON.stringify(part.state).slice(0, 1000)}`);
  return JSON.parse(part.state.output);
}

/** argv lists of commands that change a machine (anything but reads). */
export function changeCommands(calls) {
  const reads = new Set(["machine list", "machine get", "snapshots list", "auth", "whoami", "version", "env list"]);
  return calls.filter((argv) => {
    const words = argv.filter((a) => !a.startsWith("-"));
    return !reads.has(words.slice(0, 2).join(" ")) && !reads.has(words[0]);
  });
}

/**
 * A write through the bridge's patched filesystem shim into preopen `dir` of `grants`, in
 * a worker as the component's calls run: {ok: the bytes read back, mode} or {error}; job
 * "chmod-fails" instead opens files there with the 0600 chmod failing (probe-worker.mjs).
 */
export function probeWrite(grants, dir, job = "write") {
  const worker = new Worker(new URL("./probe-worker.mjs", import.meta.url), { workerData: { grants: { preopens: grants.preopens, ledger: grants.ledger }, dir, job } });
  return new Promise((resolve, reject) => {
    worker.once("message", resolve);
    worker.once("error", reject);
  }).finally(() => worker.terminate());
}

/** Whether a process is gone (or a zombie nobody has reaped yet: this container's PID 1 does not). */
export function gone(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 1).trim().startsWith("Z");
  } catch {
    return true;
  }
}

/** The pid a test's script wrote into `file`; `cleanup` (run after the tests) SIGKILLs it. */
export function notedPid(file, cleanup) {
  const pid = Number(fs.readFileSync(file, "utf8").trim());
  cleanup.push(() => {
    try {
      process.kill(pid, "SIGKILL");
    } catch {}
  });
  return pid;
}

/** Whether `pid` is gone within `ms`. */
export async function waitGone(pid, ms = 10000) {
  // The monotonic clock: this machine's wall clock can jump, which ended a wait at once.
  const until = performance.now() + ms;
  while (!gone(pid) && performance.now() < until) await sleep(50);
  return gone(pid);
}
