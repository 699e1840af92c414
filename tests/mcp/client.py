#!/usr/bin/env python3
"""Drive `boxd-host mcp` with the official MCP Python SDK (its stdio client), as an
agent host would: initialize, list the tools, call them, read errors and progress.

Run by tests/host/mcp.rs with the paths it needs; prints one line per check and ends
with `N passed, N failed` (and `, N skipped`). Exit 0 only when nothing failed.

    client.py --host BOXD_HOST --boxd BOXD_LOCAL --project DIR --ledger DIR
              --boxd-home DIR [--opencode PATH] [--lifecycle | --skip-lifecycle REASON]

The environment is passed through to the server (BOXD_LOCAL_HOME, BOXD_HOST_CACHE, …):
the SDK would otherwise give the server only a short default environment.
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import traceback

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

TIMEOUT = 300  # seconds for one tool call; a first ensure starts a guest OpenCode

args = None
counts = {"passed": 0, "failed": 0, "skipped": 0}
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def host_flags(extra=()):
    flags = ["--project", args.project, "--ledger", args.ledger, "--boxd", args.boxd]
    if args.opencode:
        flags += ["--opencode", args.opencode]
    return flags + list(extra)


@contextlib.asynccontextmanager
async def session(*extra):
    """One `boxd-host [flags] mcp` server and an initialized client session on it."""
    params = StdioServerParameters(command=args.host, args=host_flags(extra) + ["mcp"], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, read_timeout_seconds=TIMEOUT) as s:
            s.init = await s.initialize()
            yield s


def answer(result):
    """The JSON a tool result carries: its text content, checked against structuredContent."""
    assert len(result.content) == 1 and result.content[0].type == "text", result.content
    value = json.loads(result.content[0].text)
    assert result.structured_content == value, (result.structured_content, value)
    return value


def ok(result):
    value = answer(result)
    assert not result.is_error, value
    return value


def err(result, code):
    """A tool error: isError with exactly {"error","message","next"}."""
    value = answer(result)
    assert result.is_error, value
    assert value.get("error") == code, value
    assert set(value) == {"error", "message", "next"}, value
    assert value["message"] and value["next"], value
    return value


def boxd_calls():
    try:
        with open(os.path.join(args.boxd_home, "calls.jsonl")) as f:
            return [json.loads(line)["argv"] for line in f if line.strip()]
    except FileNotFoundError:
        return []


class Progress:
    def __init__(self):
        self.seen = []

    async def __call__(self, progress, total, message):
        self.seen.append((progress, total, message))


@check
async def initialize_names_the_server_and_the_workflow():
    async with session() as s:
        info = s.init.server_info
        version = subprocess.run([args.host, "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]
        assert (info.name, info.version) == ("opencode-boxd", version), info
        assert s.init.capabilities.tools is not None
        text = s.init.instructions or ""
        for word in ("boxd_ensure", "boxd_submit", "boxd_job", "boxd_harvest", "boxd_sleep", "boxd_drop", "later turn"):
            assert word in text, (word, text)


@check
async def every_described_tool_is_listed_with_its_schema_and_annotations():
    manifest = json.loads(subprocess.run([args.host] + host_flags() + ["describe"], capture_output=True, text=True, check=True).stdout)
    async with session() as s:
        listed = {t.name: t for t in (await s.list_tools()).tools}
    assert set(listed) == {t["name"] for t in manifest["tools"]}, sorted(listed)
    for t in manifest["tools"]:
        tool = listed[t["name"]]
        assert tool.input_schema == t["inputSchema"], t["name"]
        assert tool.description == t["description"], t["name"]
        a = tool.annotations
        assert a.read_only_hint is (t["access"] == "read"), (t["name"], a)
        assert a.destructive_hint is (t["name"] == "boxd_drop"), (t["name"], a)


@check
async def boxd_status_answers_as_text_and_structured_content():
    async with session() as s:
        v = ok(await s.call_tool("boxd_status", {}))
    assert v["boxd"]["cli"] == "signed in", v["boxd"]
    assert v["host"]["name"] == "boxd-host-mcp", v["host"]
    assert v["next"], v


@check
async def bad_arguments_and_unknown_tools_are_tool_errors_with_a_next_step():
    async with session() as s:
        e = err(await s.call_tool("boxd_ensure", {"work": 42}), "ARGS_INVALID")
        assert e["message"] == "argument 'work' must be a string", e
        err(await s.call_tool("boxd_ensure", {}), "ARGS_INVALID")
        err(await s.call_tool("boxd_teleport", {}), "TOOL_UNKNOWN")
    assert not any(c[:2] == ["machine", "new"] for c in boxd_calls()), boxd_calls()


@check
async def a_failing_tool_gives_its_code_and_next_step():
    async with session() as s:
        e = err(await s.call_tool("boxd_drop", {"work": "nosuch"}), "WORK_UNKNOWN")
        assert "nosuch" in e["message"], e
        e = err(await s.call_tool("boxd_job", {"work": "nosuch"}), "WORK_UNKNOWN")
        assert "taskState" not in e, "an error is not a run: it has no task state"


@check
async def progress_only_for_long_calls_that_passed_their_checks():
    async with session() as s:
        # Refused before any program runs: bad arguments, an unknown work. No progress.
        for call, code in ((("boxd_ensure", {"work": 42}), "ARGS_INVALID"), (("boxd_resume", {"work": "nosuch"}), "WORK_UNKNOWN")):
            p = Progress()
            err(await s.call_tool(*call, progress_callback=p), code)
            assert p.seen == [], (call, p.seen)
        q = Progress()
        ok(await s.call_tool("boxd_status", {}, progress_callback=q))
        assert q.seen == [], q.seen
    async with session("--options", '{"access":"read-only"}') as s:
        p = Progress()
        err(await s.call_tool("boxd_ensure", {"work": "w9"}, progress_callback=p), "ACCESS_DENIED")
        assert p.seen == [], p.seen
    # Past its checks, a long call reports its start (at its first boxd call) and its end,
    # even when it then fails: here the golden snapshot it asks boxd for does not exist.
    async with session("--options", '{"snapshot":"no-such-golden"}') as s:
        p = Progress()
        err(await s.call_tool("boxd_ensure", {"work": "w9"}, progress_callback=p), "SNAPSHOT_MISSING")
        assert [(x[0], x[1]) for x in p.seen] == [(0, 1), (1, 1)], p.seen
        assert p.seen[0][2] == "boxd_ensure started" and p.seen[1][2] == "boxd_ensure finished", p.seen


@check
async def a_grant_the_host_cannot_make_answers_every_call_after_the_handshake():
    async with session("--options", '{"allowedRoots":["/no/such/root"]}') as s:
        assert len((await s.list_tools()).tools) == 10
        for tool, arguments in (("boxd_status", {}), ("boxd_ensure", {"work": "w1"})):
            e = err(await s.call_tool(tool, arguments), "OPTIONS_INVALID")
            assert "/no/such/root" in e["message"] and "allowedRoots" in e["next"], e


@check
async def status_knows_the_laptop_opencode_and_carries_no_opencode_only_fields():
    assert args.opencode, "run with --opencode: the server learns the laptop's OpenCode version from it"
    version = subprocess.run([args.opencode, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    async with session() as s:
        v = ok(await s.call_tool("boxd_status", {}))
    assert v["guest"]["opencode"] == version, v["guest"]
    for field in ("agentsWithoutRules", "rulesAdded", "skills"):
        assert field not in v, (field, v)


@check
async def read_only_refuses_changes_before_any_boxd_call():
    before = len(boxd_calls())
    async with session("--options", '{"access":"read-only"}') as s:
        e = err(await s.call_tool("boxd_ensure", {"work": "w1"}), "ACCESS_DENIED")
        assert "read-only" in e["next"], e
        after_ensure = boxd_calls()[before:]
        assert ok(await s.call_tool("boxd_status", {}))["access"] == "read-only"
    assert after_ensure == [], f"boxd_ensure reached boxd: {after_ensure}"


@check
async def the_audit_log_flag_works_as_in_call():
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "audit.jsonl")
        async with session("--audit-log", log) as s:
            ok(await s.call_tool("boxd_status", {}))
        with open(log) as f:
            lines = [json.loads(line) for line in f]
    assert [line["tool"] for line in lines] == ["boxd_status"], lines
    assert lines[0]["result"] == "ok", lines


async def job_until_settled(s, work):
    """boxd_job until its taskState is no longer working (bounded): the client polls
    across calls, as an agent does across turns; no call waits."""
    with anyio.fail_after(120):
        while True:
            result = await s.call_tool("boxd_job", {"work": work})
            value = answer(result)
            if value.get("taskState") != "working":
                return result, value
            await anyio.sleep(0.5)


@check
async def lifecycle_ensure_submit_job_sleep_resume():
    if not args.lifecycle:
        return "skip"
    w1 = {"work": "w1"}
    async with session() as s:
        p = Progress()
        v = ok(await s.call_tool("boxd_ensure", w1, progress_callback=p))
        assert v["created"] is True and v["state"] == "running", v
        assert [x[0] for x in p.seen] == [0, 1], p.seen
        job = ok(await s.call_tool("boxd_job", w1))
        assert (job["state"], job["taskState"]) == ("idle", None), job

        # A failed run is a fact about the run, not a failed read: idle, outcome failed,
        # the run's error as fields, and the task state failed.
        ok(await s.call_tool("boxd_submit", {"work": "w1", "prompt": "break @@fail:500@@"}))
        result, e = await job_until_settled(s, "w1")
        assert not result.is_error, e
        assert (e["state"], e["outcome"], e["errorCode"], e["taskState"]) == ("idle", "failed", "GUEST_RUN_FAILED", "failed"), e

        # A run that takes a while: working while busy, then completed.
        p = Progress()
        v = ok(await s.call_tool("boxd_submit", {"work": "w1", "prompt": "mcp task @@sleep:2500@@"}, progress_callback=p))
        assert v["admitted"] is True and len(p.seen) == 2, (v, p.seen)
        job = ok(await s.call_tool("boxd_job", w1))
        assert (job["state"], job["taskState"]) == ("busy", "working"), job
        _, job = await job_until_settled(s, "w1")
        assert (job["state"], job["outcome"], job["taskState"]) == ("idle", "completed", "completed"), job

        v = ok(await s.call_tool("boxd_sleep", w1))
        assert v["state"] == "asleep", v
        job = ok(await s.call_tool("boxd_job", w1))
        assert (job["state"], job["taskState"]) == ("asleep", None), job
        v = ok(await s.call_tool("boxd_resume", w1))
        assert v["action"] == "woken", v
        job = ok(await s.call_tool("boxd_job", w1))
        assert job["state"] == "idle" and job["taskState"] in (None, "completed"), job
        # Nothing was harvested: drop refuses, as from the command line.
        err(await s.call_tool("boxd_drop", w1), "NOT_PROVEN")


async def main():
    for fn in CHECKS:
        name = fn.__name__
        try:
            with anyio.fail_after(4 * TIMEOUT):
                outcome = await fn()
        except Exception as e:  # noqa: BLE001 -- report every failure and go on
            counts["failed"] += 1
            detail = "".join(traceback.format_exception_only(type(e), e)).strip()
            print(f"FAIL {name}: {detail}", flush=True)
            traceback.print_exc(file=sys.stderr)
            continue
        if outcome == "skip":
            counts["skipped"] += 1
            print(f"skip {name}: {args.skip_lifecycle}", flush=True)
        else:
            counts["passed"] += 1
            print(f"ok   {name}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", required=True)
    ap.add_argument("--boxd", required=True)
    ap.add_argument("--project", required=True)
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--boxd-home", required=True)
    ap.add_argument("--opencode")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--lifecycle", action="store_true")
    mode.add_argument("--skip-lifecycle", metavar="REASON")
    args = ap.parse_args()
    anyio.run(main)
    line = f"{counts['passed']} passed, {counts['failed']} failed"
    if counts["skipped"]:
        line += f", {counts['skipped']} skipped"
    print(line, flush=True)
    sys.exit(1 if counts["failed"] else 0)
