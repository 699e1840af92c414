// Progress of a long call, shown where OpenCode shows a running tool: the title of its part
// (the TUI's tool line, the web view's step). OpenCode 1.18.33 hands a plugin tool
// `ctx.metadata` as a lazy Effect the plugin cannot run (seen: it returns an Effect object
// and the part never changes), so the bridge updates the part itself, through the
// server's own route for that (PATCH /session/:id/message/:mid/part/:pid, operation
// part.update) and the plugin's client, as lib/version.js reads the version.
//
// Updates go one at a time, each re-reading the part first: one that is no longer running
// (aborted, finished) is never touched. `close()` waits for the last one, so no update can
// land after the call returns and OpenCode writes the result.
import { within } from "./version.js";

export function progressReporter(input, ctx) {
  const client = input.client?._client;
  const base = `/session/${ctx.sessionID}/message/${ctx.messageID}`;
  let chain = Promise.resolve();
  let closed = false;

  async function update(title, metadata) {
    if (closed || ctx.abort?.aborted || !client) return;
    const message = (await within(5000, client.get({ url: base })))?.data;
    const part = message?.parts?.find((p) => p.type === "tool" && p.callID === ctx.callID);
    if (!part || part.state?.status !== "running" || closed) return;
    await within(5000, client.patch({
      url: `${base}/part/${part.id}`,
      headers: { "Content-Type": "application/json" },
      body: { ...part, state: { ...part.state, title, metadata: { ...part.state.metadata, ...metadata } } },
    }));
  }

  return {
    /** Show `title` on the running part (best effort: progress never fails a call). */
    report(title, metadata = {}) {
      chain = chain.then(() => update(title, metadata)).catch(() => {});
    },
    /** No update after this resolves. */
    async close() {
      closed = true;
      await chain;
    },
  };
}
