// Scripted OpenAI-compatible model for tests: a deterministic stand-in for a real provider.
// Node 20, no dependencies.
//
//   PORT=0 MODEL_LOG=/tmp/model.jsonl node host-bridge/tour/scripted-model.mjs
//   -> prints "scripted model listening on http://127.0.0.1:<port>/v1"
//
// Routes: POST /v1/chat/completions (SSE when `stream` is true, one JSON object otherwise),
// GET /v1/models. Everything else is 404.
//
// The answer is decided from the newest user message of the request ("the prompt") and
// the turns the model already took since that message. Directives in the prompt:
//
//   @@tool:NAME:{json}@@   one call of tool NAME with those arguments (only if the request
//                          offers NAME; otherwise the directive is ignored)
//   @@task:{json}@@        sugar for @@tool:task:{json}@@ (a sub-agent / child session)
//   @@fail:CODE@@          this turn answers HTTP CODE with an OpenAI-style error body
//                          (401 = invalid api key; 500 = server error) and the header
//                          retry-after-ms: 20, so OpenCode's own retries (5 for 5xx) end fast
//   @@sleep:MS@@           delay the next turn by MS milliseconds
//   @@echo-bytes@@         final reply: "ECHO_BYTES sha256=<hex> bytes=<n>" of the prompt's
//                          exact UTF-8 text
//
// Tool, task and fail directives are "steps", taken in the order they appear, one per model
// turn. A sleep delays the step that follows it (or the final reply if none follows). When
// every step is done the model replies with text:
//   - after at least one tool step: "MODEL_DONE after NAME: <last tool result, first 200 chars>"
//   - otherwise: "MODEL_REPLY: <prompt, whitespace collapsed, first 200 chars>"
// Requests from OpenCode's title generator get a fixed short title at once.
// Each request is appended to $MODEL_LOG (one JSON object per line) when that is set.
import http from "node:http";
import fs from "node:fs";
import crypto from "node:crypto";

const HOST = "127.0.0.1";
const PORT = Number(process.env.PORT ?? 0);
const LOG = process.env.MODEL_LOG;
let counter = 0;

function textOf(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((p) => (typeof p === "string" ? p : p?.type === "text" || p?.text !== undefined ? p.text ?? "" : "")).join("");
  }
  return "";
}

const DIRECTIVE = /@@tool:([A-Za-z0-9_.-]+):(\{.*?\})@@|@@task:(\{.*?\})@@|@@fail:(\d{3})@@|@@sleep:(\d+)@@|@@echo-bytes@@/gs;

// The prompt's plan: steps (one per turn), each with the delay before it, plus the final reply.
function plan(prompt, offered) {
  const steps = [];
  let sleep = 0;
  let echo = false;
  for (const m of prompt.matchAll(DIRECTIVE)) {
    if (m[1] !== undefined) {
      if (offered.has(m[1])) steps.push({ kind: "tool", name: m[1], args: m[2], sleep });
      sleep = 0;
    } else if (m[3] !== undefined) {
      if (offered.has("task")) steps.push({ kind: "tool", name: "task", args: m[3], sleep });
      sleep = 0;
    } else if (m[4] !== undefined) {
      steps.push({ kind: "fail", status: Number(m[4]), sleep });
      sleep = 0;
    } else if (m[5] !== undefined) {
      sleep += Number(m[5]);
    } else {
      echo = true;
    }
  }
  return { steps, finalSleep: sleep, echo };
}

function isTitleRequest(msgs) {
  return msgs.some((m) => m.role === "system" && /title generator/i.test(textOf(m.content)));
}

// Decide this turn: {text} | {tool:{name,args}} | {fail:status}, plus {sleep}.
export function decide(body) {
  const msgs = body.messages ?? [];
  if (isTitleRequest(msgs)) return { text: "Scripted session", sleep: 0, kind: "title" };
  const offered = new Set((body.tools ?? []).map((t) => t.function?.name ?? t.name));
  let lastUser = -1;
  for (let i = msgs.length - 1; i >= 0; i--) if (msgs[i].role === "user") { lastUser = i; break; }
  const prompt = lastUser >= 0 ? textOf(msgs[lastUser].content) : "";
  const after = msgs.slice(lastUser + 1);
  // turns already taken for this prompt = assistant messages that called a tool
  const done = after.filter((m) => m.role === "assistant" && Array.isArray(m.tool_calls) && m.tool_calls.length > 0).length;
  const p = plan(prompt, offered);
  if (done < p.steps.length) {
    const s = p.steps[done];
    if (s.kind === "fail") return { fail: s.status, sleep: s.sleep, kind: "fail" };
    return { tool: { name: s.name, args: s.args }, sleep: s.sleep, kind: "tool" };
  }
  if (p.echo) {
    const bytes = Buffer.from(prompt, "utf8");
    const hex = crypto.createHash("sha256").update(bytes).digest("hex");
    return { text: `ECHO_BYTES sha256=${hex} bytes=${bytes.length}`, sleep: p.finalSleep, kind: "echo" };
  }
  if (done > 0) {
    const results = after.filter((m) => m.role === "tool");
    const last = results[results.length - 1];
    let name = "?";
    for (const m of after) for (const tc of m.tool_calls ?? []) if (last && tc.id === last.tool_call_id) name = tc.function?.name ?? "?";
    return { text: `MODEL_DONE after ${name}: ${textOf(last?.content).slice(0, 200)}`, sleep: p.finalSleep, kind: "done" };
  }
  return { text: `MODEL_REPLY: ${prompt.replace(/\s+/g, " ").trim().slice(0, 200)}`, sleep: p.finalSleep, kind: "reply" };
}

function errorBody(status) {
  if (status === 401) {
    return { error: { message: "Incorrect API key provided: scripted-invalid. invalid api key", type: "invalid_request_error", param: null, code: "invalid_api_key" } };
  }
  if (status === 403) return { error: { message: "Forbidden: this key may not use the model", type: "invalid_request_error", param: null, code: "forbidden" } };
  if (status === 429) return { error: { message: "Rate limit reached (scripted)", type: "requests", param: null, code: "rate_limit_exceeded" } };
  return { error: { message: `The scripted model failed with HTTP ${status}.`, type: status >= 500 ? "server_error" : "invalid_request_error", param: null, code: null } };
}

function chunk(id, model, delta, finish = null) {
  return `data: ${JSON.stringify({ id, object: "chat.completion.chunk", created: Math.floor(Date.now() / 1000), model, choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
}

function respond(res, body, d) {
  if (res.destroyed || res.writableEnded) return;
  if (d.fail) {
    // OpenCode retries 408/409/429/5xx up to 5 times with a 2 s..30 s backoff unless the
    // provider names a delay: a tiny retry-after-ms makes a scripted failure final in < 1 s.
    res.writeHead(d.fail, { "content-type": "application/json", "retry-after-ms": "20" });
    return res.end(JSON.stringify(errorBody(d.fail)));
  }
  const n = ++counter;
  const id = `chatcmpl-scripted-${n}`;
  const model = body.model ?? "scripted-model";
  const usage = { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 };
  const call = d.tool ? { id: `call_scripted_${n}`, type: "function", function: { name: d.tool.name, arguments: d.tool.args } } : null;
  if (!body.stream) {
    const message = call ? { role: "assistant", content: null, tool_calls: [call] } : { role: "assistant", content: d.text };
    res.writeHead(200, { "content-type": "application/json" });
    return res.end(JSON.stringify({ id, object: "chat.completion", created: Math.floor(Date.now() / 1000), model,
      choices: [{ index: 0, message, finish_reason: call ? "tool_calls" : "stop" }], usage }));
  }
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" });
  res.write(chunk(id, model, { role: "assistant", content: "" }));
  if (call) {
    res.write(chunk(id, model, { tool_calls: [{ index: 0, id: call.id, type: "function", function: { name: call.function.name, arguments: "" } }] }));
    res.write(chunk(id, model, { tool_calls: [{ index: 0, function: { arguments: call.function.arguments } }] }));
    res.write(chunk(id, model, {}, "tool_calls"));
  } else {
    const half = Math.ceil(d.text.length / 2);
    res.write(chunk(id, model, { content: d.text.slice(0, half) }));
    res.write(chunk(id, model, { content: d.text.slice(half) }));
    res.write(chunk(id, model, {}, "stop"));
  }
  res.write(`data: ${JSON.stringify({ id, object: "chat.completion.chunk", created: Math.floor(Date.now() / 1000), model, choices: [], usage })}\n\n`);
  res.write("data: [DONE]\n\n");
  res.end();
}

function sendJson(res, status, obj) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(obj));
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const path = (req.url ?? "").split("?")[0];
    if (req.method === "GET" && path.endsWith("/models")) {
      return sendJson(res, 200, { object: "list", data: [{ id: "scripted-model", object: "model", owned_by: "tests" }] });
    }
    if (req.method !== "POST" || !path.endsWith("/chat/completions")) {
      return sendJson(res, 404, { error: { message: `no route ${req.method} ${req.url}`, type: "not_found" } });
    }
    let body;
    try {
      body = JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}");
    } catch (e) {
      return sendJson(res, 400, { error: { message: `bad JSON: ${e.message}`, type: "invalid_request_error" } });
    }
    const d = decide(body);
    if (LOG) {
      const entry = { t: new Date().toISOString(), url: req.url, stream: !!body.stream, decision: { ...d }, tools: (body.tools ?? []).map((t) => t.function?.name ?? t.name), body };
      try { fs.appendFileSync(LOG, JSON.stringify(entry) + "\n"); } catch {}
    }
    if (d.sleep > 0) {
      const timer = setTimeout(() => respond(res, body, d), d.sleep);
      res.on("close", () => clearTimeout(timer));
    } else {
      respond(res, body, d);
    }
  });
});

server.listen(PORT, HOST, () => {
  console.log(`scripted model listening on http://${HOST}:${server.address().port}/v1`);
});
for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => { server.close(); process.exit(0); });
