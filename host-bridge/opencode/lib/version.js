// The running OpenCode's version, for the component's host gate (HOST_UNTESTED) and the
// guest's version check. A plugin is not told it, so:
//   1. GET /global/health through the plugin's own client (`input.client`), which answers
//      {"healthy":true,"version":"1.18.33"} both under `opencode serve` and in the TUI (the
//      client then uses an in-process fetch). The v1 SDK has no method for that route, so
//      the request goes through its underlying client. Asked at the first tool call, never
//      during plugin start-up (a request that arrives while the server starts can hang).
//   2. `<process.execPath> --version`: inside a plugin process.execPath is the opencode
//      binary (OpenCode sets OPENCODE=1 for itself); ~1.5 s, so only as the fallback.
// "unknown" if both fail: the component then refuses changes as HOST_UNTESTED.
import { execFile } from "node:child_process";

const VERSION = /^\d+\.\d+\.\d+\S*$/;

export function within(ms, promise) {
  let timer;
  return Promise.race([promise, new Promise((_, reject) => (timer = setTimeout(() => reject(new Error("timeout")), ms)))]).finally(() => clearTimeout(timer));
}

export async function opencodeVersion(input, env = process.env) {
  try {
    const r = await within(5000, input.client._client.get({ url: "/global/health" }));
    const v = r?.data?.version;
    if (typeof v === "string" && VERSION.test(v)) return v;
  } catch {}
  if (env.OPENCODE) {
    try {
      const out = await within(20000, new Promise((resolve, reject) =>
        execFile(process.execPath, ["--version"], { timeout: 20000, env: { PATH: env.PATH ?? "", HOME: env.HOME ?? "" } }, (e, stdout) => (e ? reject(e) : resolve(stdout)))));
      const v = out.trim();
      if (VERSION.test(v)) return v;
    } catch {}
  }
  return "unknown";
}
