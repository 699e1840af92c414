#!/usr/bin/env bash
# Install what a fresh machine lacks to build and test opencode-boxd, then stop.
# Idempotent and quiet when everything is present. Used by the README's commands and by .ci/run.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

say() { printf 'bootstrap: %s\n' "$*" >&2; }

command -v cargo >/dev/null || { say "cargo is missing: install Rust 1.95 with rustup (https://rustup.rs)"; exit 1; }
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
  say "adding the wasm32-wasip2 target"
  rustup target add wasm32-wasip2
fi

command -v node >/dev/null || { say "node (>= 20) is missing: it runs the pinned OpenCode the tests use"; exit 1; }
command -v python3 >/dev/null || { say "python3 is missing: the guest helper runs on it"; exit 1; }
command -v git >/dev/null || { say "git is missing"; exit 1; }

# The real OpenCode (guest and laptop in the tests) and the MCP Inspector (its CLI is the
# second real MCP client, tests/host/mcp_inspector.rs) from npm, pinned in tests/package.json.
pinned() { node -e 'console.log(require(process.argv[1]).dependencies[process.argv[2]])' "$here/tests/package.json" "$1"; }
want=$(pinned opencode-ai)
have=$("$here/tests/node_modules/.bin/opencode" --version 2>/dev/null || true)
inspector_want=$(pinned @modelcontextprotocol/inspector)
inspector_have=$("$here/tests/node_modules/.bin/mcp-inspector" --version 2>/dev/null || true)
if [ "$have" != "$want" ] || [ "$inspector_have" != "$inspector_want" ]; then
  say "installing opencode-ai@$want and @modelcontextprotocol/inspector@$inspector_want into tests/node_modules"
  # npm install, not ci: the lock lists only this platform of opencode-ai's optional binaries.
  (cd "$here/tests" && npm install --no-fund --no-audit --loglevel=error)
  # npm may skip the package's postinstall, which links the platform binary into place.
  "$here/tests/node_modules/.bin/opencode" --version >/dev/null 2>&1 \
    || (cd "$here/tests/node_modules/opencode-ai" && node postinstall.mjs)
fi

# The official MCP Python SDK in tests/.venv, pinned in tests/mcp/requirements.txt: the real
# client that drives `boxd-host mcp` in tests/host/mcp.rs. A copy of the requirements in the
# venv marks what it holds.
req="$here/tests/mcp/requirements.txt"
venv="$here/tests/.venv"
if ! cmp -s "$req" "$venv/requirements.txt"; then
  say "installing $(grep -v '^#' "$req" | tr '\n' ' ')into tests/.venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  cp "$req" "$venv/requirements.txt"
fi

# The OpenCode bridge's build tools (jco, esbuild) and its pinned preview2-shim, exactly as
# host-bridge/opencode/package-lock.json has them; `npm run build` there makes its dist/.
# A folder installed from an older lock (another jco) is installed again.
bridge="$here/host-bridge/opencode"
[ -f "$bridge/package-lock.json" ] || { say "host-bridge/opencode/package-lock.json is missing: restore it (git checkout)"; exit 1; }
stale=
for pkg in @bytecodealliance/jco @bytecodealliance/preview2-shim esbuild; do
  locked=$(node -e 'console.log(require(process.argv[1]).packages["node_modules/" + process.argv[2]]?.version ?? "")' "$bridge/package-lock.json" "$pkg")
  installed=$(node -e 'console.log(require(process.argv[1]).version)' "$bridge/node_modules/$pkg/package.json" 2>/dev/null || true)
  [ -n "$locked" ] && [ "$installed" = "$locked" ] || stale=1
done
if [ -n "$stale" ]; then
  say "installing the OpenCode bridge's build tools into host-bridge/opencode/node_modules"
  (cd "$here/host-bridge/opencode" && npm ci --no-fund --no-audit --loglevel=error)
fi
