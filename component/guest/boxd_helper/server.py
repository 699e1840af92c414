"""The work's `opencode serve`: started detached in the work tree, found again through
server.json, probed for health, and restarted when it died, but not on a machine short of
memory (what most likely killed it) and never while it merely hangs."""

import os
import re
import subprocess
import time

from .disk import FileLock, now_iso, write_json
from .opencode import Api, ApiError, find_opencode, opencode_env
from .procs import free_port, identity, kill_group, largest_processes, machine_health, owned_alive, port_listening, session_cpu
from .protocol import Fail

LISTEN_TIMEOUT = 60.0
HEALTH_TIMEOUT = 5.0
# How long in all a server that keeps working without answering is asked before it counts
# as hung: a first prompt's start-up on a small or busy machine can block its event loop for
# seconds, and calling that hung told the user to rebuild a machine that was only working.
# Inside what a second caller waits for the server lock (LISTEN_TIMEOUT + 30 s = 90 s) and the
# helper's 120 s exec timeout: a probe, a kill (up to 6 s) and a start that takes the whole
# LISTEN_TIMEOUT come to ~86 s at worst.
BUSY_PATIENCE = 20.0
# Working: its processes used at least this share of one CPU while it did not answer (a
# runtime's timer or GC threads alone use far less).
BUSY_SHARE = 0.05


def start_server(work, password):
    binary = find_opencode()
    if not binary:
        raise Fail("GUEST_VERSION", "opencode is not installed on this machine (not on PATH nor in ~/.opencode/bin)")
    log_path = work.p("server.log")
    for attempt in range(3):
        port = free_port()
        if os.path.exists(log_path):
            os.replace(log_path, log_path + ".1")
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(
                [binary, "serve", "--hostname", "127.0.0.1", "--port", str(port)],
                cwd=work.tree, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                env=opencode_env(password), start_new_session=True, close_fds=True)
        info = dict(identity(proc.pid, work.tree), port=port, startedAt=now_iso(), binary=binary, ready=False)
        write_json(work.p("server.json"), info)
        port_seen, text = wait_listening(proc, log_path)
        if port_seen:
            info.update(port=port_seen, ready=True)
            write_json(work.p("server.json"), info)
            return info
        # another process took the port between our probe and the server's bind: try another
        if not re.search(r"in use|EADDRINUSE|address already|ServeError", text, re.IGNORECASE) or attempt == 2:
            raise Fail("GUEST_FAILED", "the OpenCode server exited with code %s before listening: %s" % (proc.poll(), text[-600:].strip()))


def wait_listening(proc, log_path):
    """(port, text): the port from the server's "listening on" line, or (None, log) if it exited."""
    deadline = time.monotonic() + LISTEN_TIMEOUT
    while True:
        with open(log_path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        m = re.search(r"listening on https?://[^\s:/]+:(\d+)", text)
        if m:
            return int(m.group(1)), text
        if proc.poll() is not None:
            return None, text
        if time.monotonic() > deadline:
            kill_group(proc.pid)
            raise Fail("GUEST_FAILED", "the OpenCode server did not start listening within %d s: %s" % (LISTEN_TIMEOUT, text[-600:].strip()))
        time.sleep(0.1)


def probe_server(work, password):
    """('up'|'absent'|'dead'|'hung'|'badauth', info, detail)."""
    info = work.server_info()
    if not info or not info.get("pid") or not info.get("port"):
        return "absent", None, "no server was started"
    if not owned_alive(info, work.tree):
        return "dead", info, "the server process %d is gone" % info["pid"]
    api, started, tick = Api(info["port"], password), time.monotonic(), os.sysconf("SC_CLK_TCK")
    while True:
        spent, asked = session_cpu(info["pid"]), time.monotonic()
        # The last ask ends with the patience: the probe never takes longer than BUSY_PATIENCE.
        ask = max(0.5, min(HEALTH_TIMEOUT, BUSY_PATIENCE - (asked - started)))
        try:
            health = api.get("/global/health", timeout=ask)
            if isinstance(health, dict) and health.get("healthy"):
                info["health"] = health
                return "up", info, ""
            return "hung", info, "the server answered /global/health with %s" % (str(health)[:200],)
        except ApiError as e:
            if e.status in (401, 403):
                return "badauth", info, "the server refused the stored password"
            if e.kind != "timeout":
                if not port_listening(info["port"]):
                    return "dead", info, "nothing listens on port %d (server pid %d)" % (info["port"], info["pid"])
                return "hung", info, "the server on port %d did not answer: %s" % (info["port"], e)
        if not owned_alive(info, work.tree):
            return "dead", info, "the server process %d ended while it was asked" % info["pid"]
        now, used = time.monotonic(), session_cpu(info["pid"])
        busy = spent is not None and used is not None and (used - spent) / tick >= BUSY_SHARE * (now - asked)
        waited = now - started
        if not busy:
            return "hung", info, "the server on port %d accepts connections but did not answer within %.0f s, and was not working at the end" % (info["port"], waited)
        if waited >= BUSY_PATIENCE - 0.01:
            return "hung", info, "the server on port %d accepts connections but did not answer within %.0f s, working all along" % (info["port"], waited)


def record_interruption(work, reason):
    """A run in flight lost its server: record it as aborted/interrupted (reported once by status)."""
    with work.state_lock():
        st = work.state()
        if st.current:
            work.finish_run(st, "aborted", None, "", interrupted=True, note=reason)
            st.interrupt_pending = True
            work.save_state(st)


def ensure_server(work, password, want_version=None):
    """Make sure the work's server runs. Returns (how, info): how is 'up', 'started' or 'restarted'.

    Raises GUEST_UNRESPONSIVE when the machine is short of memory or overloaded and the server
    is not answering, GUEST_FAILED when it hangs on a healthy machine or cannot start."""
    with FileLock(work.p("server.lock"), timeout=LISTEN_TIMEOUT + 30):
        how, info, detail = probe_server(work, password)
        if how == "up" and want_version and (info.get("health") or {}).get("version") not in (None, want_version):
            how, detail = "stale", "the server runs OpenCode %s, not %s" % (info["health"]["version"], want_version)
        if how == "up":
            if not info.get("ready"):
                info["ready"] = True
                info.pop("health", None)
                write_json(work.p("server.json"), info)
            return "up", info
        if how == "hung":
            short, over, why = machine_health()
            if short or over:
                raise Fail("GUEST_UNRESPONSIVE", "%s; the machine is %s; largest processes: %s" % (
                    detail, why, ", ".join(largest_processes())))
            raise Fail("GUEST_FAILED", detail)
        if how == "dead":
            # a dead server is restarted on a busy machine (load passes, the start is cheap), but
            # not when memory is short: that is most likely what killed it
            short, _, why = machine_health()
            if short:
                raise Fail("GUEST_UNRESPONSIVE", "%s and the machine is %s, so it was not restarted; largest processes: %s" % (
                    detail, why, ", ".join(largest_processes())))
        st = work.state()
        if st.current and how != "absent":
            record_interruption(work, detail)
        if info and owned_alive(info, work.tree):
            kill_group(info["pid"])
        new = start_server(work, password)
        work.log("helper.log", "server %s (%s): pid %d port %d" % ("started" if how == "absent" else "restarted", detail, new["pid"], new["port"]))
        return ("started" if how == "absent" else "restarted"), new
