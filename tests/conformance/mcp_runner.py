#!/usr/bin/env python3
"""Run tests/conformance/scenario.json through `boxd-host mcp` with the official MCP
Python SDK and write each step's raw result (the tool's JSON, or its error object) to
--out as a JSON array. The comparison with the other hosts is in tests/host/conformance.rs.

    mcp_runner.py --host BOXD_HOST --probe PROBE_WASM --out FILE -- --opencode PATH <boxd-host flags…>

A step with "host" runs on its own server, started with that setup's flags (scenario
`hosts`: other plugin options, the probe component, or a laptop opencode that fails).
"""

import argparse
import json
import os
import shutil
import sys

import contextlib

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client


@contextlib.asynccontextmanager
async def session(a, flags):
    params = StdioServerParameters(command=a.host, args=flags + ["mcp"], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            yield s


def setup_flags(a, scenario, name):
    """The boxd-host flags of a host setup (scenario `hosts`)."""
    setup = scenario["hosts"][name]
    flags = []
    if "options" in setup:
        flags += ["--options", json.dumps(setup["options"])]
    if setup.get("component") == "probe":
        flags += ["--component", a.probe]
    if "opencodeFails" in setup:
        flags += ["--opencode", failing_opencode(a, setup["opencodeFails"])]
    return flags


def failing_opencode(a, fails):
    """tests/conformance/opencode-that-fails.sh in a folder beside --out, next to the real
    opencode (--opencode among the host flags) and its count of failures."""
    folder = os.path.join(os.path.dirname(os.path.abspath(a.out)), "failing-opencode")
    os.makedirs(folder, exist_ok=True)
    wrapper = os.path.join(folder, "opencode")
    shutil.copy(os.path.join(os.path.dirname(__file__), "opencode-that-fails.sh"), wrapper)
    real = os.path.join(folder, "real")
    if os.path.lexists(real):
        os.remove(real)
    os.symlink(a.real_opencode, real)
    with open(os.path.join(folder, "fails"), "w") as f:
        f.write(str(fails))
    open(os.path.join(folder, "commands"), "w").close()
    return wrapper


def failures_spent(a, scenario, step):
    """After a step whose laptop opencode fails: the host ran it as many times as it fails,
    and imported as often as the setup's `opencodeImports` says."""
    setup = scenario["hosts"].get(step.get("host"), {})
    if "opencodeFails" not in setup:
        return
    folder = os.path.join(os.path.dirname(os.path.abspath(a.out)), "failing-opencode")
    left = open(os.path.join(folder, "fails")).read().strip()
    if left != "0":
        raise SystemExit(f"{step['tool']}: the laptop's opencode was not run as often as it fails ({left} left)")
    ran = open(os.path.join(folder, "commands")).read().split()
    if ran.count("import") != setup["opencodeImports"]:
        raise SystemExit(f"{step['tool']}: {ran.count('import')} imports ran, not {setup['opencodeImports']} ({ran})")


def arm_faults(step):
    """A step's boxd-local fault rules (scenario `faults`), written just before it."""
    if "faults" in step:
        with open(os.path.join(os.environ["BOXD_LOCAL_HOME"], "faults.json"), "w") as f:
            json.dump(step["faults"], f)


def disarm_faults(step):
    """After a step with faults: every rule fired, and none is left for the next step."""
    if "faults" not in step:
        return
    path = os.path.join(os.environ["BOXD_LOCAL_HOME"], "faults.json")
    rules = json.load(open(path))
    os.remove(path)
    for rule in rules:
        if rule.get("times") != 0:
            raise SystemExit(f"{step['tool']}: the fault {rule} never fired")


async def run_step(s, step):
    arm_faults(step)
    try:
        return await call_step(s, step)
    finally:
        disarm_faults(step)


async def call_step(s, step):
    for _ in range(240):
        r = await s.call_tool(step["tool"], step["args"])
        value = json.loads(r.content[0].text)
        until = step.get("until", {})
        if not r.is_error and until and all(value.get(k) == v for k, v in until.items()):
            await anyio.sleep(0.5)
            continue
        return {"tool": step["tool"], "isError": bool(r.is_error), "value": value}


async def main(a, flags):
    scenario = json.load(open(os.path.join(os.path.dirname(__file__), "scenario.json")))
    results = []
    async with session(a, flags) as s:
        for step in scenario["steps"]:
            if "host" in step:
                async with session(a, flags + setup_flags(a, scenario, step["host"])) as other:
                    results.append(await run_step(other, step))
                failures_spent(a, scenario, step)
            else:
                results.append(await run_step(s, step))
    json.dump(results, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser()
    p.add_argument("--host", required=True)
    p.add_argument("--probe", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv[:split])
    flags = argv[split + 1:]
    # The real opencode: the one the host flags name (a failing one is laid out beside it).
    if "--opencode" not in flags[:-1]:
        raise SystemExit("mcp_runner.py: the boxd-host flags must name the real opencode (--opencode PATH)")
    a.real_opencode = os.path.abspath(flags[flags.index("--opencode") + 1])
    anyio.run(main, a, flags)
