// A tool's answer as OpenCode shows it to the model: pretty JSON with its one next step at
// the head, then the short fields, the longest last. OpenCode cuts a long tool output and
// keeps its head: a harvest of hundreds of files lost its next step, its proof and its git
// state, which came after its "files" list in the component's (alphabetical) order.

const HEAD = ["error", "message", "next"];

/** @param {unknown} value the tool's parsed answer */
export function answerText(value) {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return JSON.stringify(value, null, 2);
  const head = HEAD.filter((k) => k in value);
  const rest = Object.keys(value)
    .filter((k) => !head.includes(k))
    // UTF-8 bytes, as boxd-host's out.rs measures them, so both hosts order alike.
    .map((k) => [k, Buffer.byteLength(JSON.stringify(value[k]) ?? "")])
    .sort((a, b) => a[1] - b[1]) // stable: keys of one length keep their order
    .map(([k]) => k);
  const ordered = {};
  for (const k of [...head, ...rest]) ordered[k] = value[k];
  return JSON.stringify(ordered, null, 2);
}
