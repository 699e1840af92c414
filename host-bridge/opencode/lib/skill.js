// The check behind SKILLS_INVALID: the plugin's own skill file must be there and carry the
// frontmatter OpenCode needs (a `name`, which must be "boxd", and a `description`, which is
// how the model decides to load it). Returns the reason it is unusable, or undefined.
import fs from "node:fs";

export function checkSkill(file) {
  let text;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch {
    return `${file} is missing`;
  }
  const m = /^---\r?\n([\s\S]*?)\r?\n---\r?\n/.exec(text);
  if (!m) return `${file} has no frontmatter (a --- block at the top)`;
  const field = (key) => {
    const f = new RegExp(`^${key}:[ \\t]*(.*)$`, "m").exec(m[1]);
    return f ? f[1].trim().replace(/^(["'])(.*)\1$/, "$2").trim() : "";
  };
  const name = field("name");
  if (!name) return `${file} has no name in its frontmatter`;
  if (name !== "boxd") return `${file} names the skill "${name}", not "boxd"`;
  if (!field("description")) return `${file} has no description in its frontmatter`;
  if (!text.slice(m[0].length).trim()) return `${file} has no body`;
  return undefined;
}
