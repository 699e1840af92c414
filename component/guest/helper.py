#!/usr/bin/env python3
"""opencode-boxd guest helper: owns the guest side of one work.

The laptop uploads this file to $HOME/.boxd-helper/helper-<sha256>.py and runs

    python3 helper.py <command> --work <id> [flags]      (payloads on stdin, never argv)

through `boxd machine exec`. Every command prints exactly one JSON object on stdout:
exit 0 with {"ok": true, ...}, exit 3 with {"ok": false, "error": KIND, "message": ...}
for a domain failure, exit 2 for a malformed command line, 70 if the helper itself crashed.
Nothing is written to stderr except on a crash, so the output also parses where an exec
merges the two streams. docs/guest.md describes the protocol.

Commands: prepare, submit, status, export, git, seal, import (and `pump`, which prepare and
status start detached: it feeds queued prompts to OpenCode and records their outcomes).
State lives in $HOME/work/<id>/.boxd/ and survives a frozen machine and a restarted pump.
Python 3.10+, standard library only.
"""

import argparse
import base64
import errno
import fcntl
import hashlib
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone

PROTOCOL = 1
EXIT_OK, EXIT_USAGE, EXIT_DOMAIN, EXIT_CRASH = 0, 2, 3, 70

USERNAME = "opencode"
FILE_MAX = 8 * 1024 * 1024          # per file, both directions
CALL_MAX = 32 * 1024 * 1024         # per call, both directions
PROMPT_MAX = 16 * 1024 * 1024
LAST_TEXT_MAX = 4096                # bytes of UTF-8 kept in lastText
LIST_MAX = 5000                     # entries per git listing
TICK_SECONDS = 0.5
LISTEN_TIMEOUT = 60.0
HEALTH_TIMEOUT = 5.0
START_GRACE = (60, 30.0)            # (ticks, seconds) idle with no new message before giving up
SETTLE_GRACE = (10, 5.0)            # (ticks, seconds) idle with an unfinished reply before deciding
SEEN_PROMPTS = 500                  # promptIds remembered for duplicate submits
WORK_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
PROMPT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
SESSION_ID_RE = re.compile(r"^ses_[A-Za-z0-9]{1,64}$")
AUTH_RE = re.compile(
    r"unauthori[sz]ed|invalid[ _-]?(x-)?api[ _-]?key|incorrect api key|api[ _-]?key.{0,40}(invalid|expired|missing|not valid)"
    r"|authentication[ _-]?(failed|error|required)|invalid[ _-]authentication|not authenticated",
    re.IGNORECASE,
)
SELF = os.path.realpath(os.path.abspath(__file__))


class Fail(Exception):
    """A domain failure: exit 3 with {"ok": false, "error": kind, "message": ...}."""

    def __init__(self, kind, message, **extra):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.extra = extra


class Usage(Exception):
    pass


# ---------------------------------------------------------------------------------------
# small utilities


def now_iso(ts=None):
    ts = time.time() if ts is None else ts
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % int((ts % 1) * 1000)


def emit(obj, code):
    data = json.dumps(obj, ensure_ascii=True, separators=(",", ":")) + "\n"
    out = sys.stdout.buffer
    out.write(data.encode("ascii"))
    out.flush()
    return code


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()


def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path, data, mode=0o644, durable=True):
    """Write bytes to path via a temp file in the same folder, fsync, rename."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path)[:40] + ".", suffix=".boxd-tmp", dir=folder)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if durable:
            os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
        if durable:
            fsync_dir(folder)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path, obj, mode=0o644):
    atomic_write(path, json.dumps(obj, ensure_ascii=True, indent=1).encode("ascii"), mode)


def read_json(path, default=None):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        return default
    except (ValueError, UnicodeDecodeError):
        return default


def read_text(path):
    try:
        with open(path, "r", encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def cap_utf8(text, limit):
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore")


def pid_alive(pid):
    """True when pid names a live (not zombie) process."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read().decode("ascii", "replace")
        state = stat[stat.rindex(")") + 2:].split(" ", 1)[0]
        return state not in ("Z", "X")
    except (OSError, ValueError):
        return True


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def proc_start(pid):
    """The process's start time in clock ticks since boot (field 22 of /proc/pid/stat)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read().decode("ascii", "replace")
        return int(stat[stat.rindex(")") + 2:].split(" ")[19])
    except (OSError, ValueError, IndexError):
        return None


def proc_cwd(pid):
    try:
        return os.readlink("/proc/%d/cwd" % pid)
    except OSError:
        return None


def identity(pid, cwd):
    """What tells this process apart from a later one that reuses its pid, a reboot, or the
    same files copied to another home (a fork that copies disks but not processes)."""
    return {"pid": pid, "boot": boot_id(), "start": proc_start(pid), "cwd": os.path.realpath(cwd)}


def owned_alive(ident, cwd):
    """True when the process recorded as ident (pid/boot/start) still runs, in folder cwd."""
    if not isinstance(ident, dict) or not pid_alive(ident.get("pid")):
        return False
    if ident.get("boot") and ident["boot"] != boot_id():
        return False
    if ident.get("start") is not None and proc_start(ident["pid"]) not in (None, ident["start"]):
        return False
    actual = proc_cwd(ident["pid"])
    if actual is not None and actual != os.path.realpath(cwd):
        return False
    return True


def proc_cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def kill_group(pid, grace=3.0):
    """SIGTERM the process group led by pid (falling back to the pid), then SIGKILL."""
    if not pid_alive(pid):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except OSError:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if sig == signal.SIGTERM:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.05)


def port_listening(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine_health():
    """(short_of_memory, overloaded, description) from /proc: MemAvailable below 10 % of
    MemTotal; 1-minute load above 4x the CPUs. BOXD_HELPER_MACHINE=well|short-of-memory|overloaded
    replaces the measurement (tests use it so a busy test machine cannot change their results)."""
    forced = os.environ.get("BOXD_HELPER_MACHINE")
    if forced == "well":
        return False, False, ""
    if forced == "short-of-memory":
        return True, False, "short of memory (BOXD_HELPER_MACHINE)"
    if forced == "overloaded":
        return False, True, "overloaded (BOXD_HELPER_MACHINE)"
    mem = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                mem[k] = int(v.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/proc/loadavg") as f:
            load1 = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        load1 = 0.0
    cpus = os.cpu_count() or 1
    total, avail = mem.get("MemTotal", 0), mem.get("MemAvailable", 0)
    short, over = bool(total and avail < total * 0.10), load1 > 4 * cpus
    reasons = []
    if short:
        reasons.append("short of memory (%d MiB available of %d MiB)" % (avail // 1024, total // 1024))
    if over:
        reasons.append("overloaded (1-minute load %.1f on %d CPUs)" % (load1, cpus))
    return short, over, " and ".join(reasons)


def largest_processes(n=3):
    procs = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/status" % name) as f:
                info = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
            rss_kb = int(info.get("VmRSS", "0 kB").split()[0])
        except (OSError, ValueError):
            continue
        cmd = proc_cmdline(int(name)).strip() or info.get("Name", "?")
        procs.append((rss_kb, int(name), cmd[:80]))
    procs.sort(reverse=True)
    return ["%s (pid %d, %d MiB)" % (cmd, pid, rss // 1024) for rss, pid, cmd in procs[:n]]


class FileLock:
    """flock(2) on a lock file, with a timeout; released when the process dies."""

    def __init__(self, path, timeout=30.0):
        self.path, self.timeout, self.fd = path, timeout, None

    def try_acquire(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as e:
            os.close(self.fd)
            self.fd = None
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise

    def __enter__(self):
        deadline = time.monotonic() + self.timeout
        while not self.try_acquire():
            if time.monotonic() > deadline:
                raise TimeoutError("lock %s is held by another helper" % self.path)
            time.sleep(0.05)
        return self

    def release(self):
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = None

    def __exit__(self, *exc):
        self.release()


# ---------------------------------------------------------------------------------------
# OpenCode


def find_opencode():
    """The opencode executable: $BOXD_OPENCODE, then PATH, then the usual install places."""
    env = os.environ.get("BOXD_OPENCODE")
    if env:
        return env if os.access(env, os.X_OK) else None
    found = shutil.which("opencode")
    if found:
        return found
    home = os.path.expanduser("~")
    candidates = [
        os.path.join(home, ".opencode", "bin", "opencode"),
        os.path.join(home, ".local", "bin", "opencode"),
        os.path.join(home, ".bun", "bin", "opencode"),
        os.path.join(home, ".npm-global", "bin", "opencode"),
        "/usr/local/bin/opencode",
        "/usr/bin/opencode",
    ]
    nvm = os.path.join(home, ".nvm", "versions", "node")
    try:
        for v in sorted(os.listdir(nvm), reverse=True):
            candidates.append(os.path.join(nvm, v, "bin", "opencode"))
    except OSError:
        pass
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def opencode_env(password=None):
    env = dict(os.environ)
    for k in ("OPENCODE_SERVER_PASSWORD", "OPENCODE_SERVER_USERNAME"):
        env.pop(k, None)
    if password is not None:
        env["OPENCODE_SERVER_PASSWORD"] = password
        env["OPENCODE_SERVER_USERNAME"] = USERNAME
    return env


class ApiError(Exception):
    def __init__(self, message, status=None, body=None, kind="http"):
        super().__init__(message)
        self.status, self.body, self.kind = status, body, kind


class Api:
    """HTTP to the work's OpenCode server on 127.0.0.1 (no proxies), Basic auth."""

    def __init__(self, port, password):
        self.port = port
        token = base64.b64encode(("%s:%s" % (USERNAME, password)).encode("utf-8")).decode("ascii")
        self.auth = "Basic " + token

    def call(self, method, path, body=None, timeout=15.0):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        headers = {"authorization": self.auth, "accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            headers["content-type"] = "application/json"
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except socket.timeout as e:
            raise ApiError("%s %s: no answer within %.0f s" % (method, path, timeout), kind="timeout") from e
        except ConnectionRefusedError as e:
            raise ApiError("%s %s: connection refused" % (method, path), kind="refused") from e
        except (OSError, http.client.HTTPException) as e:
            raise ApiError("%s %s: %s" % (method, path, e), kind="io") from e
        finally:
            conn.close()
        parsed = None
        if raw:
            try:
                parsed = json.loads(raw.decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                parsed = raw.decode("utf-8", "replace")
        if resp.status >= 300:
            raise ApiError("%s %s: HTTP %d %s" % (method, path, resp.status, str(parsed)[:300]), status=resp.status, body=parsed)
        return resp.status, parsed

    def get(self, path, timeout=15.0):
        return self.call("GET", path, timeout=timeout)[1]


# ---------------------------------------------------------------------------------------
# the work


class Work:
    def __init__(self, work_id):
        if not isinstance(work_id, str) or not WORK_RE.match(work_id):
            raise Fail("NAME_INVALID", "work id %r is not valid: use [a-z][a-z0-9-]*, at most 63 characters" % (work_id,))
        self.id = work_id
        self.home = os.path.expanduser("~")
        self.tree = os.path.join(self.home, "work", work_id)
        self.boxd = os.path.join(self.tree, ".boxd")
        self.inbox = os.path.join(self.boxd, "inbox")

    def p(self, *names):
        return os.path.join(self.boxd, *names)

    def exists(self):
        return os.path.isdir(self.boxd)

    def require(self):
        if not self.exists():
            raise Fail("WORK_UNKNOWN", "work %s was never prepared on this machine (%s is missing)" % (self.id, self.boxd))

    def create(self):
        try:
            os.makedirs(self.tree, exist_ok=True)
            os.makedirs(self.inbox, exist_ok=True)
            os.makedirs(self.p("tmp"), exist_ok=True)
            os.chmod(self.boxd, 0o700)
            probe = self.p(".write-probe")
            with open(probe, "wb") as f:
                f.write(b"ok")
            os.unlink(probe)
        except OSError as e:
            raise Fail("GUEST_WORKSPACE", "cannot create the work tree %s: %s" % (self.tree, e.strerror or e))

    # -- files
    def password(self):
        pw = read_text(self.p("password"))
        if pw is None:
            raise Fail("WORK_UNKNOWN", "work %s has no server password: run prepare" % self.id)
        return pw

    def session_id(self):
        sid = (read_text(self.p("session")) or "").strip()
        return sid or None

    def set_session_id(self, sid):
        atomic_write(self.p("session"), (sid + "\n").encode("ascii"))

    def server_info(self):
        return read_json(self.p("server.json"))

    def state(self):
        st = read_json(self.p("state.json"), None) or {}
        st.setdefault("version", PROTOCOL)
        st.setdefault("nextSeq", 1)
        st.setdefault("dispatchedSeq", 0)
        st.setdefault("runs", 0)
        st.setdefault("current", None)
        st.setdefault("last", None)
        st.setdefault("lastActivityAt", None)
        st.setdefault("interruptPending", False)
        st.setdefault("seen", [])
        return st

    def save_state(self, st):
        write_json(self.p("state.json"), st)

    def inbox_entries(self):
        """[(seq, filename)] oldest first."""
        out = []
        try:
            names = os.listdir(self.inbox)
        except FileNotFoundError:
            return out
        for n in names:
            m = re.match(r"^(\d{12})-.*\.json$", n)
            if m:
                out.append((int(m.group(1)), n))
        out.sort()
        return out

    def state_lock(self, timeout=30.0):
        return FileLock(self.p("state.lock"), timeout)

    def log(self, name, text):
        try:
            path = self.p(name)
            if os.path.exists(path) and os.path.getsize(path) > 2 * 1024 * 1024:
                os.replace(path, path + ".1")
            with open(path, "a", encoding="utf-8") as f:
                f.write("%s %s\n" % (now_iso(), text))
        except OSError:
            pass


def ensure_git_exclude(work):
    """Make git ignore .boxd/ whenever the tree is (now) a repository."""
    dotgit = os.path.join(work.tree, ".git")
    if os.path.isdir(dotgit) and not os.path.islink(dotgit):
        exclude = os.path.join(dotgit, "info", "exclude")
    elif os.path.isfile(dotgit):
        r = git(work, ["rev-parse", "--git-path", "info/exclude"], check=False)
        if r.returncode != 0:
            return
        exclude = r.stdout.decode("utf-8", "replace").strip()
        if not os.path.isabs(exclude):
            exclude = os.path.join(work.tree, exclude)
    else:
        return
    try:
        current = ""
        if os.path.exists(exclude):
            with open(exclude, "r", encoding="utf-8", errors="replace") as f:
                current = f.read()
        if any(line.strip() in (".boxd/", "/.boxd/", ".boxd", "/.boxd") for line in current.splitlines()):
            return
        os.makedirs(os.path.dirname(exclude), exist_ok=True)
        with open(exclude, "a", encoding="utf-8") as f:
            if current and not current.endswith("\n"):
                f.write("\n")
            f.write(".boxd/\n")
    except OSError:
        pass


# ---------------------------------------------------------------------------------------
# the server


def opencode_version(binary):
    try:
        r = subprocess.run([binary, "--version"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=60, env=opencode_env())
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Fail("GUEST_VERSION", "cannot run %s --version: %s" % (binary, e))
    text = r.stdout.decode("utf-8", "replace").strip()
    if r.returncode != 0 or not text:
        raise Fail("GUEST_VERSION", "%s --version failed (exit %d): %s" % (binary, r.returncode,
                                                                             r.stderr.decode("utf-8", "replace")[-300:]))
    return text.splitlines()[-1].strip()


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
    try:
        health = Api(info["port"], password).get("/global/health", timeout=HEALTH_TIMEOUT)
        if isinstance(health, dict) and health.get("healthy"):
            info["health"] = health
            return "up", info, ""
        return "hung", info, "the server answered /global/health with %s" % (str(health)[:200],)
    except ApiError as e:
        if e.status in (401, 403):
            return "badauth", info, "the server refused the stored password"
        if e.kind == "timeout":
            return "hung", info, "the server on port %d accepts connections but did not answer within %.0f s" % (info["port"], HEALTH_TIMEOUT)
        if not port_listening(info["port"]):
            return "dead", info, "nothing listens on port %d (server pid %d)" % (info["port"], info["pid"])
        return "hung", info, "the server on port %d did not answer: %s" % (info["port"], e)


def record_interruption(work, reason):
    """A run in flight lost its server: record it as aborted/interrupted (reported once by status)."""
    with work.state_lock():
        st = work.state()
        if st["current"]:
            finish_run(work, st, "aborted", None, "", interrupted=True, note=reason)
            st["interruptPending"] = True
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
        if st["current"] and how != "absent":
            record_interruption(work, detail)
        if info and owned_alive(info, work.tree):
            kill_group(info["pid"])
        new = start_server(work, password)
        work.log("helper.log", "server %s (%s): pid %d port %d" % ("started" if how == "absent" else "restarted", detail, new["pid"], new["port"]))
        return ("started" if how == "absent" else "restarted"), new


# ---------------------------------------------------------------------------------------
# the pump


def ensure_pump(work):
    """Start the detached pump unless one runs with this very helper file."""
    lock = FileLock(work.p("pump.lock"))
    if lock.try_acquire():
        lock.release()
    else:
        info = read_json(work.p("pump.json")) or {}
        if info.get("script") == SELF or not owned_alive(info, work.boxd):
            return False
        # a pump of another helper version: replace it
        if "pump" in proc_cmdline(info["pid"]):
            kill_group(info["pid"], grace=2.0)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if lock.try_acquire():
                lock.release()
                break
            time.sleep(0.05)
    log_path = work.p("pump.log")
    if os.path.exists(log_path) and os.path.getsize(log_path) > 2 * 1024 * 1024:
        os.replace(log_path, log_path + ".1")
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen([sys.executable, SELF, "pump", "--work", work.id], cwd=work.boxd,
                                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, env=dict(os.environ))
    # wait (briefly) until it holds its lock and wrote pump.json, so callers see one pump
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and proc.poll() is None:
        if (read_json(work.p("pump.json")) or {}).get("pid") == proc.pid:
            break
        time.sleep(0.02)
    return True


def run_pump(work):
    work.require()
    lock = FileLock(work.p("pump.lock"))
    if not lock.try_acquire():
        return 0
    write_json(work.p("pump.json"), dict(identity(os.getpid(), work.boxd), script=SELF, startedAt=now_iso()))
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    print("%s pump %d started for %s" % (now_iso(), os.getpid(), work.id), flush=True)
    last_error, last_error_at = None, 0.0
    while not stop:
        if not work.exists():
            break
        try:
            tick(work, lock_timeout=5.0)
        except TimeoutError:
            pass
        except Exception:  # the pump must outlive any single failure; log each distinct one once a minute
            text = traceback.format_exc()
            if text != last_error or time.monotonic() - last_error_at > 60:
                print("%s tick failed:\n%s" % (now_iso(), text), flush=True)
                last_error, last_error_at = text, time.monotonic()
        time.sleep(TICK_SECONDS)
    print("%s pump %d stopped" % (now_iso(), os.getpid()), flush=True)
    return 0


def classify(msg):
    """(outcome, failure) from a finished assistant message."""
    info = msg.get("info") or {}
    err = info.get("error")
    if err:
        name = err.get("name") or "Error"
        data = err.get("data") or {}
        message = str(data.get("message") or name)
        if name == "MessageAbortedError":
            return "aborted", None
        status = data.get("statusCode")
        if name == "ProviderAuthError" or status in (401, 403) or AUTH_RE.search(message) or AUTH_RE.search(str(data.get("responseBody") or "")[:2000]):
            return "failed", {"kind": "auth", "message": "%s: %s" % (name, message)}
        return "failed", {"kind": "other", "message": "%s: %s" % (name, message)}
    finish = info.get("finish")
    if finish and finish not in ("tool-calls", "tool_calls"):
        return "completed", None
    return "aborted", None


def newest_text(messages):
    for m in reversed(messages):
        if (m.get("info") or {}).get("role") != "assistant":
            continue
        for part in reversed(m.get("parts") or []):
            if part.get("type") == "text" and isinstance(part.get("text"), str) and part["text"].strip():
                return part["text"]
    return ""


def finish_run(work, st, outcome, failure, text, interrupted=False, note=None):
    cur = st["current"] or {}
    ts = time.time()
    st["last"] = {
        "seq": cur.get("seq"), "promptId": cur.get("promptId"), "sessionId": cur.get("sessionId"),
        "outcome": outcome, "failure": failure, "lastText": cap_utf8(text or "", LAST_TEXT_MAX),
        "interrupted": bool(interrupted), "startedAt": cur.get("sentAt"), "finishedAt": now_iso(ts),
    }
    if note:
        st["last"]["note"] = note
    st["current"] = None
    st["lastActivityAt"] = now_iso(ts)
    try:
        with open(work.p("runs.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(st["last"], ensure_ascii=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        pass


def ensure_session(work, api):
    sid = work.session_id()
    if sid:
        try:
            api.get("/session/%s" % sid)
            return sid
        except ApiError as e:
            if e.status != 404:
                raise
            work.log("helper.log", "session %s is missing from OpenCode; creating a new root session" % sid)
    created = api.call("POST", "/session", {"title": "boxd work %s" % work.id})[1]
    sid = created["id"]
    work.set_session_id(sid)
    return sid


def tick(work, lock_timeout=10.0):
    """One step of the pump: follow the run in flight, or start the oldest queued prompt."""
    with work.state_lock(lock_timeout):
        st = work.state()
        # drop inbox files that were already sent (a crash between send and unlink)
        entries = []
        for seq, name in work.inbox_entries():
            if seq <= st["dispatchedSeq"]:
                try:
                    os.unlink(os.path.join(work.inbox, name))
                except OSError:
                    pass
            else:
                entries.append((seq, name))
        info = work.server_info() or {}
        alive = bool(info.get("ready")) and owned_alive(info, work.tree)
        if st["current"]:
            follow_run(work, st, info, alive)
        if not st["current"] and entries and alive:
            dispatch(work, st, info, entries[0])


def follow_run(work, st, info, alive):
    cur = st["current"]
    run_server = cur.get("server") or {}
    run_pid = run_server.get("pid")
    if run_pid and not owned_alive(run_server, work.tree):
        # the server that accepted this prompt is gone: the run cannot finish any more
        finish_run(work, st, "aborted", None, "", interrupted=True,
                   note="the OpenCode server (pid %s) stopped while the run was in flight" % run_pid)
        st["interruptPending"] = True
        work.save_state(st)
        return
    if not alive:
        return
    api = Api(info["port"], work.password())
    sid = cur["sessionId"]
    try:
        smap = api.get("/session/status", timeout=10)
    except ApiError:
        return
    entry = smap.get(sid) if isinstance(smap, dict) else None
    now = time.time()
    if entry:
        retry = entry if entry.get("type") == "retry" else None
        changed = bool(cur.get("idleTicks")) or cur.get("retry") != retry
        cur["idleTicks"], cur["idleSince"], cur["retry"] = 0, None, retry
        try:
            updated = ((api.get("/session/%s" % sid, timeout=10) or {}).get("time") or {}).get("updated")
            if isinstance(updated, (int, float)) and updated / 1000.0 - (cur.get("activity") or 0) >= 5:
                cur["activity"] = updated / 1000.0
                st["lastActivityAt"] = now_iso(updated / 1000.0)
                changed = True
        except ApiError:
            pass
        if changed:
            work.save_state(st)
        return
    try:
        msgs = api.get("/session/%s/message" % sid, timeout=60)
    except ApiError:
        return
    if not isinstance(msgs, list):
        return
    cur["idleTicks"] = cur.get("idleTicks", 0) + 1
    cur["idleSince"] = cur.get("idleSince") or now
    cur["retry"] = None
    idle_ticks, idle_for = cur["idleTicks"], now - cur["idleSince"]
    new = msgs[cur.get("baseCount", 0):]
    if not new:
        if idle_ticks >= START_GRACE[0] and idle_for >= START_GRACE[1]:
            finish_run(work, st, "failed", {"kind": "other", "message": "OpenCode accepted the prompt but never started the run"}, "")
        work.save_state(st)
        return
    last = msgs[-1]
    linfo = last.get("info") or {}
    done = linfo.get("role") == "assistant" and (linfo.get("error") or (
        (linfo.get("time") or {}).get("completed") and linfo.get("finish") not in (None, "tool-calls", "tool_calls")))
    if done or (idle_ticks >= SETTLE_GRACE[0] and idle_for >= SETTLE_GRACE[1]):
        if linfo.get("role") == "assistant":
            outcome, failure = classify(last)
        else:
            outcome, failure = "failed", {"kind": "other", "message": "the run ended without an assistant reply"}
        finish_run(work, st, outcome, failure, newest_text(new))
    work.save_state(st)


def dispatch(work, st, info, entry):
    seq, name = entry
    path = os.path.join(work.inbox, name)
    item = read_json(path)
    if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
        work.log("helper.log", "dropping unreadable inbox entry %s" % name)
        st["dispatchedSeq"] = max(st["dispatchedSeq"], seq)
        work.save_state(st)
        os.unlink(path)
        return
    api = Api(info["port"], work.password())
    try:
        sid = ensure_session(work, api)
        smap = api.get("/session/status", timeout=10)
        if isinstance(smap, dict) and smap.get(sid):
            return  # busy with something we did not send: wait
        base = api.get("/session/%s/message" % sid, timeout=60)
        base_count = len(base) if isinstance(base, list) else 0
        api.call("POST", "/session/%s/prompt_async" % sid, {"parts": [{"type": "text", "text": item["prompt"]}]}, timeout=60)
    except ApiError as e:
        if e.status in (400, 404, 413, 422):
            # OpenCode will never take this prompt: record it as a failed run instead of looping
            st["current"] = {"seq": seq, "promptId": item.get("promptId"), "sessionId": work.session_id(), "sentAt": now_iso()}
            st["runs"] += 1
            st["dispatchedSeq"] = max(st["dispatchedSeq"], seq)
            finish_run(work, st, "failed", {"kind": "other", "message": "OpenCode refused the prompt: %s" % e}, "")
            work.save_state(st)
            os.unlink(path)
        else:
            work.log("helper.log", "dispatch of %s deferred: %s" % (name, e))
        return
    ts = time.time()
    st["current"] = {"seq": seq, "promptId": item.get("promptId"), "sessionId": sid, "sentAt": now_iso(ts),
                     "baseCount": base_count, "idleTicks": 0, "idleSince": None,
                     "server": {k: info.get(k) for k in ("pid", "boot", "start", "cwd")}}
    st["runs"] += 1
    st["dispatchedSeq"] = max(st["dispatchedSeq"], seq)
    st["lastActivityAt"] = now_iso(ts)
    work.save_state(st)
    try:
        os.unlink(path)
        fsync_dir(work.inbox)
    except OSError:
        pass


# ---------------------------------------------------------------------------------------
# commands


def read_stdin():
    return sys.stdin.buffer.read()


def cmd_prepare(args):
    work = Work(args.work)
    raw = read_stdin()
    password = raw.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8", "replace")
    work.create()
    old = read_text(work.p("password"))
    if not password:
        password = old or secrets.token_urlsafe(32)
    changed = old is not None and old != password
    if old != password:
        atomic_write(work.p("password"), password.encode("utf-8"), mode=0o600)
    os.chmod(work.p("password"), 0o600)
    try:
        os.unlink(work.p("sealed"))  # ensure and resume reopen a work a refused drop sealed
    except FileNotFoundError:
        pass
    try:
        repo = ensure_repo(work)
    except Fail as e:  # no git on the image: the work runs, and drop will say GIT_UNKNOWN
        work.log("helper.log", "prepare: the work tree could not be made a repository: %s" % e.message)
        repo = "unavailable"
    binary = find_opencode()
    if not binary:
        raise Fail("GUEST_VERSION", "opencode is not installed on this machine; expected version %s" % args.opencode_version)
    have = opencode_version(binary)
    if args.opencode_version and have != args.opencode_version:
        raise Fail("GUEST_VERSION", "the machine has OpenCode %s but the laptop runs %s" % (have, args.opencode_version),
                   guestVersion=have, laptopVersion=args.opencode_version)
    st_path = work.p("state.json")
    if not os.path.exists(st_path):
        st = work.state()
        st["lastActivityAt"] = now_iso()
        work.save_state(st)
    if changed:
        info = work.server_info()
        if info and owned_alive(info, work.tree):
            with FileLock(work.p("server.lock"), timeout=LISTEN_TIMEOUT + 30):
                kill_group(info["pid"])
    how, info = ensure_server(work, password, want_version=args.opencode_version)
    ensure_pump(work)
    return {"ok": True, "work": work.id, "port": info["port"], "serverStarted": how != "up",
            "opencodeVersion": have, "tree": work.tree, "protocol": PROTOCOL, "repo": repo}


def resolve_prompts(work, ids):
    """{promptId: admitted?} for ids the laptop recorded but never heard back about."""
    if not ids:
        return {}
    seen = set(work.state()["seen"]) if work.exists() else set()
    for _, name in work.inbox_entries():
        seen.add(name.split("-", 1)[1][:-len(".json")])
    return {i: i in seen for i in ids if isinstance(i, str) and PROMPT_ID_RE.match(i)}


def resolve_arg(args):
    return [i for i in (getattr(args, "resolve", None) or "").split(",") if i]


GIT_IDENTITY = ("opencode-boxd", "opencode-boxd@localhost")


def ensure_repo(work):
    """Make the work tree a git repository with a first commit of what it starts with, so
    every later change can be accounted for. A tree that already is one is left alone."""
    top = git(work, ["rev-parse", "--show-toplevel"], check=False)
    if top.returncode == 0 and os.path.realpath(top.stdout.decode("utf-8", "replace").strip()) == os.path.realpath(work.tree):
        ensure_git_exclude(work)
        return "existing"
    git(work, ["init", "-q"])
    ensure_git_exclude(work)
    # An identity for this repository when the image configures none, so the agent's own
    # commits work too (they are what drop later asks the laptop to hold).
    if git(work, ["config", "user.email"], check=False).returncode != 0:
        git(work, ["config", "user.name", GIT_IDENTITY[0]])
        git(work, ["config", "user.email", GIT_IDENTITY[1]])
    git(work, ["add", "-A"])
    git(work, ["commit", "-q", "--allow-empty", "--no-verify", "-m", "opencode-boxd: the work tree as it started"])
    return "created"


def safe_rel(rel):
    """Split a relative path into components, or None when it is absolute / escapes / names .boxd."""
    if not isinstance(rel, str) or not rel or "\0" in rel or rel.startswith("/") or rel.endswith("/"):
        return None
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return None
    parts = [c for c in rel.split("/") if c not in ("", ".")]
    if not parts or any(c == ".." for c in parts) or parts[0] == ".boxd":
        return None
    return parts


def check_target(work, parts, kind):
    """Refuse symlinks and non-directories on the way to tree/parts; returns the absolute path."""
    cur = work.tree
    for i, comp in enumerate(parts):
        cur = os.path.join(cur, comp)
        try:
            os.lstat(cur)
        except FileNotFoundError:
            return cur if i == len(parts) - 1 else os.path.join(cur, *parts[i + 1:])
        if os.path.islink(cur):
            raise Fail(kind, "%s is a symlink; refusing %s" % ("/".join(parts[:i + 1]), "/".join(parts)), path="/".join(parts))
        last = i == len(parts) - 1
        if not last and not os.path.isdir(cur):
            raise Fail(kind, "%s is not a folder; refusing %s" % ("/".join(parts[:i + 1]), "/".join(parts)), path="/".join(parts))
        if last and os.path.isdir(cur):
            raise Fail(kind, "%s is a folder" % "/".join(parts), path="/".join(parts))
    return cur


def cmd_submit(args):
    work = Work(args.work)
    work.require()
    if sealed_recently(work):
        raise Fail("SESSION_BUSY", "work %s was sealed for a drop moments ago; nothing was written or admitted" % work.id)
    raw = read_stdin()
    try:
        payload = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise Fail("ARGS_INVALID", "submit expects one JSON object on stdin: %s" % e)
    if not isinstance(payload, dict):
        raise Fail("ARGS_INVALID", "submit expects one JSON object on stdin")
    prompt_id, prompt, files = payload.get("promptId"), payload.get("prompt"), payload.get("files") or []
    to_resolve = payload.get("resolve") or []
    if not isinstance(to_resolve, list):
        raise Fail("ARGS_INVALID", "resolve must be a list of prompt ids")
    if not isinstance(prompt_id, str) or not PROMPT_ID_RE.match(prompt_id):
        raise Fail("NAME_INVALID", "promptId %r is not valid: use [A-Za-z0-9._-], at most 80 characters" % (prompt_id,))
    if not isinstance(prompt, str) or not prompt:
        raise Fail("ARGS_INVALID", "prompt must be a non-empty string")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise Fail("ARGS_INVALID", "prompt is not valid Unicode (it holds a lone surrogate)")
    if len(prompt.encode("utf-8")) > PROMPT_MAX:
        raise Fail("ARGS_INVALID", "prompt is larger than %d MiB" % (PROMPT_MAX >> 20))
    if not isinstance(files, list):
        raise Fail("ARGS_INVALID", "files must be a list")
    # validate every file before writing any
    planned, total, seen_paths = [], 0, set()
    for i, f in enumerate(files):
        if not isinstance(f, dict):
            raise Fail("ARGS_INVALID", "files[%d] must be an object" % i)
        rel = f.get("to")
        parts = safe_rel(rel)
        if parts is None:
            raise Fail("NAME_INVALID", "files[%d].to %r must be a relative path inside the work tree (no '..', not under .boxd)" % (i, rel), path=rel)
        try:
            data = base64.b64decode(f.get("data") or "", validate=True)
        except (ValueError, TypeError) as e:
            raise Fail("ARGS_INVALID", "files[%d].data is not base64: %s" % (i, e), path=rel)
        if len(data) > FILE_MAX:
            raise Fail("FILE_TOO_LARGE", "%s is %d bytes; the limit is 8 MiB per file" % (rel, len(data)), path=rel)
        total += len(data)
        if total > CALL_MAX:
            raise Fail("FILE_TOO_LARGE", "the files add up to more than 32 MiB", path=rel)
        want = f.get("sha256")
        if want is not None and (not isinstance(want, str) or want.lower() != sha256_hex(data)):
            raise Fail("ARGS_INVALID", "%s: sha256 %s does not match the data (%s)" % (rel, want, sha256_hex(data)), path=rel)
        key = "/".join(parts)
        if key in seen_paths:
            raise Fail("NAME_INVALID", "%s is listed twice" % key, path=rel)
        seen_paths.add(key)
        target = check_target(work, parts, "NAME_INVALID")
        planned.append((parts, target, data))
    tree_real = os.path.realpath(work.tree)
    try:
        for parts, target, data in planned:
            parent = os.path.dirname(target)
            os.makedirs(parent, exist_ok=True)
            check_target(work, parts, "NAME_INVALID")
            real_parent = os.path.realpath(parent)
            if real_parent != tree_real and not real_parent.startswith(tree_real + os.sep):
                raise Fail("NAME_INVALID", "%s resolves outside the work tree" % "/".join(parts), path="/".join(parts))
            mode = 0o644
            try:
                mode = os.stat(target).st_mode & 0o7777
            except FileNotFoundError:
                pass
            atomic_write(target, data, mode=mode)
    except OSError as e:
        raise Fail("GUEST_WORKSPACE", "cannot write into the work tree: %s" % e)
    ensure_git_exclude(work)
    # admit: durable before anything else can go wrong; "queued" is decided under the same
    # lock the pump dispatches under, so the pump cannot start this prompt in between
    password = work.password()
    duplicate = False
    with work.state_lock(30.0):
        if sealed_recently(work):
            raise Fail("SESSION_BUSY", "work %s was sealed for a drop moments ago; nothing was admitted" % work.id)
        st = work.state()
        waiting = [e for e in work.inbox_entries() if e[0] > st["dispatchedSeq"]]
        queued = bool(st["current"]) or bool(waiting) or opencode_busy(work, password)
        if prompt_id in st["seen"]:
            duplicate = True
        else:
            seq = st["nextSeq"]
            entry = {"seq": seq, "promptId": prompt_id, "prompt": prompt, "admittedAt": now_iso()}
            atomic_write(os.path.join(work.inbox, "%012d-%s.json" % (seq, prompt_id)),
                         json.dumps(entry, ensure_ascii=True).encode("ascii"))
            st["nextSeq"] = seq + 1
            st["seen"] = (st["seen"] + [prompt_id])[-SEEN_PROMPTS:]
            st["lastActivityAt"] = now_iso()
            work.save_state(st)
    # then start it now when nothing runs (else the pump does, within half a second)
    try:
        ensure_server(work, password)
    except (Fail, TimeoutError) as e:
        work.log("helper.log", "submit: server not available (%s); the prompt waits in the inbox" % (getattr(e, "message", None) or e,))
    ensure_pump(work)
    try:
        tick(work, lock_timeout=20.0)
    except Exception as e:  # the prompt is admitted: the pump will start it
        work.log("helper.log", "submit: start deferred to the pump: %s: %s" % (type(e).__name__, e))
    st = work.state()
    pending = len([e for e in work.inbox_entries() if e[0] > st["dispatchedSeq"]])
    out = {"ok": True, "admitted": True, "queued": queued, "pending": pending, "sessionId": work.session_id(),
           "files": len(planned)}
    if duplicate:
        out["duplicate"] = True
    if to_resolve:
        out["resolved"] = resolve_prompts(work, to_resolve)
    return out


def opencode_busy(work, password):
    """True when OpenCode itself reports the work's session busy (e.g. a prompt sent by hand)."""
    info, sid = work.server_info() or {}, work.session_id()
    if not sid or not info.get("ready") or not owned_alive(info, work.tree):
        return False
    try:
        smap = Api(info["port"], password).get("/session/status", timeout=5)
    except ApiError:
        return False
    return bool(isinstance(smap, dict) and smap.get(sid))


def status_fields(work, st, server, smap=None):
    inbox = [e for e in work.inbox_entries() if e[0] > st["dispatchedSeq"]]
    sid = work.session_id()
    entry = smap.get(sid) if (sid and isinstance(smap, dict)) else None
    busy = bool(st["current"]) or bool(inbox) or bool(entry)
    last = st["last"] or {}
    out = {
        "state": "busy" if busy else "idle",
        "outcome": last.get("outcome"),
        "lastText": last.get("lastText", ""),
        "lastActivityAt": st["lastActivityAt"],
        "pending": len(inbox),
        "sessionId": sid,
        "runs": st["runs"],
        "server": server,
        "interrupted": bool(last.get("interrupted")),
        "failure": last.get("failure"),
        "promptId": last.get("promptId"),
    }
    if st["current"]:
        out["running"] = {"promptId": st["current"].get("promptId"), "startedAt": st["current"].get("sentAt")}
        if st["current"].get("retry"):
            r = st["current"]["retry"]
            out["retry"] = {"attempt": r.get("attempt"), "message": r.get("message"), "next": r.get("next")}
    return out


def ready_work(args):
    """The common start of status and export: the work, its server and pump running, and
    one pump step taken. Returns (work, password, how the server was found, server info)."""
    work = Work(args.work)
    work.require()
    ensure_git_exclude(work)
    password = work.password()
    how, info = ensure_server(work, password)
    ensure_pump(work)
    try:
        tick(work, lock_timeout=10.0)
    except Exception as e:  # report what the state files say; the pump keeps trying
        work.log("helper.log", "%s: pump step failed: %s: %s" % (args.command, type(e).__name__, e))
    return work, password, how, info


def cmd_status(args):
    work, password, how, info = ready_work(args)
    api, smap = Api(info["port"], password), None
    try:
        smap = api.get("/session/status", timeout=10)
    except ApiError:
        pass
    with work.state_lock(30.0):
        st = work.state()
        out = status_fields(work, st, "restarted" if how == "restarted" else "up", smap)
        report_interrupt = st["interruptPending"]
        if report_interrupt:
            st["interruptPending"] = False
            work.save_state(st)
    if out["state"] == "busy":
        try:
            perms = api.get("/permission", timeout=5)
            questions = api.get("/question", timeout=5)
            waiting = {"permissions": len(perms) if isinstance(perms, list) else 0,
                       "questions": len(questions) if isinstance(questions, list) else 0}
            if waiting["permissions"] or waiting["questions"]:
                out["waiting"] = waiting
        except ApiError:
            pass
    if report_interrupt:
        note = (st["last"] or {}).get("note") or "the OpenCode server stopped"
        raise Fail("RUN_INTERRUPTED", "prompt %s was interrupted: %s; the server was %s" % (
            out.get("promptId"), note, "restarted" if how == "restarted" else "already running again"), **out)
    out["resolved"] = resolve_prompts(work, resolve_arg(args))
    if how == "restarted":
        raise Fail("GUEST_SERVER_DOWN", "the OpenCode server was not running; it was restarted on port %d" % info["port"], **out)
    return {"ok": True, **out}


def cmd_export(args):
    work, password, how, info = ready_work(args)
    api = Api(info["port"], password)
    st = work.state()
    sid = work.session_id()
    smap = api.get("/session/status", timeout=10) or {}
    pending = [e for e in work.inbox_entries() if e[0] > st["dispatchedSeq"]]
    if st["current"] or pending or (sid and smap.get(sid)):
        raise Fail("SESSION_BUSY", "work %s is busy (a run is in flight or %d prompt(s) wait)" % (work.id, len(pending)))
    resolved = resolve_prompts(work, resolve_arg(args))
    newest = st["seen"][-1] if st["seen"] else None
    if not sid:
        return {"ok": True, "sessions": [], "resolved": resolved, "newestPrompt": newest}
    sessions, queue, seen = [], [sid], set()
    while queue:
        cur = queue.pop(0)
        if cur in seen:
            continue
        seen.add(cur)
        try:
            info_s = api.get("/session/%s" % cur, timeout=30)
        except ApiError as e:
            if e.status == 404 and cur == sid:
                raise Fail("GUEST_FAILED", "the work's root session %s is missing from OpenCode" % sid)
            raise Fail("GUEST_FAILED", "cannot read session %s: %s" % (cur, e))
        try:
            messages = api.get("/session/%s/message" % cur, timeout=120)
            children = api.get("/session/%s/children" % cur, timeout=30) or []
        except ApiError as e:
            raise Fail("GUEST_FAILED", "cannot read session %s: %s" % (cur, e))
        sessions.append({"info": info_s, "messages": messages})
        for child in sorted(children, key=lambda c: (((c.get("time") or {}).get("created") or 0), c.get("id", ""))):
            if isinstance(child, dict) and child.get("id"):
                queue.append(child["id"])
    return {"ok": True, "sessions": sessions, "resolved": resolved, "newestPrompt": newest}


def cmd_import(args):
    work = Work(args.work)
    raw = read_stdin()
    try:
        payload = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise Fail("EXPORT_INVALID", "import expects the JSON of export on stdin: %s" % e)
    sessions = payload.get("sessions") if isinstance(payload, dict) else None
    if not isinstance(sessions, list):
        raise Fail("EXPORT_INVALID", "import expects {\"sessions\": [...]} on stdin")
    by_id = {}
    for i, s in enumerate(sessions):
        sid = ((s or {}).get("info") or {}).get("id") if isinstance(s, dict) else None
        if not isinstance(sid, str) or not SESSION_ID_RE.match(sid) or not isinstance(s.get("messages"), list):
            raise Fail("EXPORT_INVALID", "sessions[%d] needs info.id (ses_...) and a messages list" % i)
        if sid in by_id:
            raise Fail("EXPORT_INVALID", "session %s appears twice" % sid)
        by_id[sid] = s
    # parents first, keeping the given order otherwise
    ordered, placed = [], set()

    def place(sid, depth=0):
        if sid in placed or depth > len(by_id):
            return
        parent = by_id[sid]["info"].get("parentID")
        if parent in by_id:
            place(parent, depth + 1)
        placed.add(sid)
        ordered.append(sid)

    for s in sessions:
        place(s["info"]["id"])
    roots = [sid for sid in ordered if by_id[sid]["info"].get("parentID") not in by_id]
    if len(roots) > 1:
        raise Fail("EXPORT_INVALID", "the export holds %d root sessions; expected one tree" % len(roots))
    work.create()
    ensure_git_exclude(work)
    st = work.state()
    if st["current"]:
        raise Fail("SESSION_BUSY", "work %s has a run in flight; import only into an idle work" % work.id)
    binary = find_opencode()
    if not binary:
        raise Fail("GUEST_VERSION", "opencode is not installed on this machine")
    for sid in ordered:
        s = by_id[sid]
        path = work.p("tmp", "import-%s.json" % sid)
        write_json(path, {"info": s["info"], "messages": s["messages"]}, mode=0o600)
        try:
            r = subprocess.run([binary, "import", path], cwd=work.tree, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300, env=opencode_env())
        except subprocess.TimeoutExpired:
            raise Fail("GUEST_FAILED", "opencode import of %s took longer than 300 s" % sid)
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
        if r.returncode != 0:
            raise Fail("GUEST_FAILED", "opencode import of %s failed (exit %d): %s" % (
                sid, r.returncode, (r.stderr or r.stdout).decode("utf-8", "replace")[-600:].strip()))
    if roots:
        work.set_session_id(roots[0])
    return {"ok": True, "imported": len(ordered), "sessionId": roots[0] if roots else work.session_id()}


# -- git


def git(work, argv, check=True, timeout=120):
    env = dict(os.environ)
    for k in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR", "GIT_PREFIX"):
        env.pop(k, None)
    env.update({"GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "PAGER": "cat"})
    cmd = ["git", "-C", work.tree, "-c", "core.quotePath=false", "-c", "color.ui=false",
           "-c", "safe.directory=" + work.tree, "-c", "core.fsmonitor=false"] + argv
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Fail("GUEST_FAILED", "git %s: %s" % (argv[0], e))
    if check and r.returncode != 0:
        raise Fail("GUEST_FAILED", "git %s failed (exit %d): %s" % (" ".join(argv[:3]), r.returncode,
                                                                     r.stderr.decode("utf-8", "replace")[-500:].strip()))
    return r


def is_boxd_path(path):
    return path == ".boxd" or path.startswith(".boxd/")


def digest_entry(work, rel_bytes):
    rel = rel_bytes.decode("utf-8", "replace")
    entry = {"path": rel}
    if "\ufffd" in rel:
        entry["lossyName"] = True
    full = os.path.join(os.fsencode(work.tree), rel_bytes.rstrip(b"/"))
    if rel.endswith("/"):
        entry.update({"dir": True, "sha256": None, "size": None})
        return entry
    try:
        st = os.lstat(full)
    except OSError:
        return None
    if os.path.islink(full):
        target = os.readlink(full)
        entry.update({"symlink": True, "size": len(target), "sha256": sha256_hex(target)})
        return entry
    # Something that is there but cannot be digested (a FIFO, a socket, a file this user
    # cannot read) is listed without a digest, so nothing can count it as accounted for.
    if not os.path.isfile(full):
        entry.update({"special": True, "sha256": None, "size": None})
        return entry
    h = hashlib.sha256()
    try:
        with open(full, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError as e:
        entry.update({"unreadable": e.strerror or str(e), "sha256": None, "size": st.st_size})
        return entry
    entry.update({"size": st.st_size, "sha256": h.hexdigest()})
    return entry


def list_paths(work, *argvs):
    names = []
    for argv in argvs:
        names += git(work, argv).stdout.split(b"\0")
    out, truncated, seen = [], False, set()
    for rel in sorted(set(names)):
        if not rel or rel in seen:
            continue
        seen.add(rel)
        if is_boxd_path(rel.decode("utf-8", "replace")):
            continue
        if len(out) >= LIST_MAX:
            truncated = True
            break
        e = digest_entry(work, rel)
        if e:
            out.append(e)
    return out, truncated


def read_requested(work, requested):
    files, total = [], 0
    for rel in requested:
        parts = safe_rel(rel)
        if parts is None:
            raise Fail("PATH_REFUSED", "%r is not a relative path inside the work tree" % (rel,), path=rel)
        full = check_target(work, parts, "PATH_REFUSED")
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            raise Fail("NAME_INVALID", "%s does not exist in the work tree" % rel, path=rel)
        if not os.path.isfile(full) or os.path.islink(full):
            raise Fail("PATH_REFUSED", "%s is not a regular file" % rel, path=rel)
        if st.st_size > FILE_MAX:
            raise Fail("FILE_TOO_LARGE", "%s is %d bytes; the limit is 8 MiB per file" % (rel, st.st_size), path=rel)
        total += st.st_size
        if total > CALL_MAX:
            raise Fail("FILE_TOO_LARGE", "the requested files add up to more than 32 MiB", path=rel)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                data = f.read(FILE_MAX + 1)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Fail("PATH_REFUSED", "%s is a symlink" % rel, path=rel)
            raise Fail("GUEST_WORKSPACE", "cannot read %s: %s" % (rel, e.strerror or e), path=rel)
        if len(data) > FILE_MAX:
            raise Fail("FILE_TOO_LARGE", "%s grew past 8 MiB while being read" % rel, path=rel)
        files.append({"path": "/".join(parts), "size": len(data), "sha256": sha256_hex(data),
                      "mode": st.st_mode & 0o777, "data": base64.b64encode(data).decode("ascii")})
    return files


def inventory(work):
    """The tree as git sees it: HEAD, every ref, status, the diff against HEAD (bytes),
    and every untracked or ignored path with its digest. repo False when the tree is not
    (the top of) a repository."""
    out = {"repo": False, "head": None, "branch": None, "status": [], "untracked": [], "ignored": [],
           "dirty": False, "refs": {}, "changed": []}
    top = git(work, ["rev-parse", "--show-toplevel"], check=False)
    if top.returncode != 0 or os.path.realpath(top.stdout.decode("utf-8", "replace").strip()) != os.path.realpath(work.tree):
        return out, None
    ensure_git_exclude(work)
    out["repo"] = True
    head = git(work, ["rev-parse", "--verify", "-q", "HEAD^{commit}"], check=False)
    out["head"] = head.stdout.decode().strip() if head.returncode == 0 else None
    br = git(work, ["symbolic-ref", "--short", "-q", "HEAD"], check=False)
    out["branch"] = br.stdout.decode("utf-8", "replace").strip() if br.returncode == 0 else None
    refs = {}
    if out["head"]:
        refs["HEAD"] = out["head"]
    for line in git(work, ["for-each-ref", "--format=%(objectname) %(refname)"]).stdout.decode("utf-8", "replace").splitlines():
        sha, _, name = line.partition(" ")
        if sha and name:
            refs[name] = sha
    out["refs"] = refs
    st = git(work, ["status", "--porcelain=v1", "--untracked-files=all"])
    lines = []
    for line in st.stdout.decode("utf-8", "replace").splitlines():
        paths = line[3:].split(" -> ")
        if any(is_boxd_path(p.strip('"')) for p in paths):
            continue
        lines.append(line)
    out["status"] = lines
    out["dirty"] = any(not line.startswith("??") for line in lines)
    out["changed"] = [line[3:] for line in lines if not line.startswith("??")][:200]
    others = ["ls-files", "-z", "--others", "--exclude-standard"]
    if out["head"]:
        out["untracked"], tu = list_paths(work, others)
    else:  # nothing is committed yet: every file, staged or not, is untracked as far as history goes
        out["untracked"], tu = list_paths(work, others, ["ls-files", "-z", "--cached"])
    out["ignored"], ti = list_paths(work, ["ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory"])
    # Repositories inside the tree: a committed gitlink (mode 160000) carries none of the
    # inner repository's commits or files, so the laptop cannot hold them through ours.
    nested = []
    for rec in git(work, ["ls-files", "-z", "-s"]).stdout.split(b"\0"):
        if rec.startswith(b"160000 "):
            nested.append(rec.split(b"\t", 1)[-1].decode("utf-8", "replace"))
    out["nested"] = sorted(nested)
    if tu:
        out["untrackedTruncated"] = True
    if ti:
        out["ignoredTruncated"] = True
    diff = None
    if out["head"]:
        diff = git(work, ["diff", "HEAD", "--binary", "--full-index", "--no-color", "--no-ext-diff", "--no-textconv",
                          "--src-prefix=a/", "--dst-prefix=b/", "--", ".", ":(exclude).boxd"]).stdout
    return out, diff


def make_bundle(work):
    """Every commit on the machine (all refs and HEAD) as one self-contained bundle,
    verified here before it travels: {"data": base64, "sha256", "size"}."""
    with tempfile.TemporaryDirectory(prefix="boxd-bundle-") as tmp:
        path = os.path.join(tmp, "harvest.bundle")
        git(work, ["bundle", "create", "-q", path, "HEAD", "--all"])
        git(work, ["bundle", "verify", "-q", path])
        with open(path, "rb") as f:
            data = f.read()
    if len(data) > CALL_MAX:
        raise Fail("FILE_TOO_LARGE", "the work's commits make a %d-byte bundle; the limit is 32 MiB per call" % len(data))
    return {"data": base64.b64encode(data).decode("ascii"), "sha256": sha256_hex(data), "size": len(data)}


def cmd_git(args):
    work = Work(args.work)
    if not os.path.isdir(work.tree):
        raise Fail("WORK_UNKNOWN", "work %s has no work tree on this machine (%s)" % (work.id, work.tree))
    requested, have = [], {}
    if args.files:
        requested += [f for f in args.files.split(",") if f]
    if args.files_stdin:
        try:
            body = json.loads(read_stdin().decode("utf-8") or "{}")
            extra = body.get("files") or []
            have = body.get("haveRefs") or {}
        except (ValueError, UnicodeDecodeError, AttributeError) as e:
            raise Fail("ARGS_INVALID", "--files-stdin expects {\"files\": [...]} on stdin: %s" % e)
        if not isinstance(extra, list) or not all(isinstance(x, str) for x in extra) or not isinstance(have, dict):
            raise Fail("ARGS_INVALID", "files must be a list of paths, haveRefs an object")
        requested += extra
    files = read_requested(work, requested)
    out, diff = inventory(work)
    out.update({"ok": True, "files": files, "patch": None})
    if diff is not None:
        try:
            out["patch"] = diff.decode("utf-8")
        except UnicodeDecodeError:
            out["patch"] = base64.b64encode(diff).decode("ascii")
            out["patchEncoding"] = "base64"
    if out["refs"]:
        if out["refs"] == have:
            out["bundleUnchanged"] = True
        else:
            out["bundle"] = make_bundle(work)
    return out


SEAL_HOLD_SECONDS = 60


def sealed_recently(work):
    """A seal younger than SEAL_HOLD_SECONDS: a drop may be removing this machine."""
    try:
        age = time.time() - os.stat(work.p("sealed")).st_mtime
    except FileNotFoundError:
        return False
    if 0 <= age < SEAL_HOLD_SECONDS:
        return True
    try:
        os.unlink(work.p("sealed"))
    except OSError:
        pass
    return False


def cmd_seal(args):
    """Before a drop: stop everything that could start or write (the pump, then the
    OpenCode server and its children), then read the tree's live state. Refuses while a
    run is in flight or prompts wait. A later command starts the server and pump again."""
    work = Work(args.work)
    work.require()
    resolved = resolve_prompts(work, resolve_arg(args))
    password = work.password()
    with work.state_lock(30.0):
        st = work.state()
        pending = [e for e in work.inbox_entries() if e[0] > st["dispatchedSeq"]]
        if st["current"] or pending or opencode_busy(work, password):
            raise Fail("SESSION_BUSY", "work %s is busy (a run is in flight or %d prompt(s) wait); nothing was stopped" % (work.id, len(pending)))
        pump = read_json(work.p("pump.json")) or {}
        if pump.get("pid") and owned_alive(pump, work.boxd):
            kill_group(pump["pid"], grace=2.0)
        server = work.server_info() or {}
        if server.get("pid") and owned_alive(server, work.tree):
            kill_group(server["pid"])
        try:
            os.unlink(work.p("server.json"))  # stopped on purpose: the next start is not a restart
        except FileNotFoundError:
            pass
        # A submit arriving between this check and the remove is refused for a while:
        # drop checks and removes within seconds; a refused drop's mark goes stale.
        atomic_write(work.p("sealed"), now_iso().encode("ascii"))
        newest = st["seen"][-1] if st["seen"] else None
    out, diff = inventory(work)
    out.pop("status", None)
    out.update({"ok": True, "sealed": True, "newestPrompt": newest, "pending": 0, "resolved": resolved,
                "diffSha256": sha256_hex(diff) if diff else None})
    return out


# ---------------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Usage(message)


def main(argv):
    parser = Parser(prog="helper.py", add_help=False)
    parser.add_argument("command", choices=["prepare", "submit", "status", "export", "git", "seal", "import", "pump", "version"])
    parser.add_argument("--work")
    parser.add_argument("--opencode-version")
    parser.add_argument("--files")
    parser.add_argument("--files-stdin", action="store_true")
    parser.add_argument("--resolve")
    try:
        args = parser.parse_args(argv)
        if args.command == "version":
            with open(SELF, "rb") as f:
                return emit({"ok": True, "protocol": PROTOCOL, "sha256": sha256_hex(f.read())}, EXIT_OK)
        if not args.work:
            raise Usage("--work is required")
        if args.command == "pump":
            return run_pump(Work(args.work))
        handler = {"prepare": cmd_prepare, "submit": cmd_submit, "status": cmd_status, "export": cmd_export,
                   "git": cmd_git, "seal": cmd_seal, "import": cmd_import}[args.command]
        return emit(handler(args), EXIT_OK)
    except Usage as e:
        return emit({"ok": False, "error": "ARGS_INVALID", "message": str(e)}, EXIT_USAGE)
    except Fail as e:
        obj = {"ok": False, "error": e.kind, "message": e.message}
        for k, v in e.extra.items():
            obj.setdefault(k, v)
        return emit(obj, EXIT_DOMAIN)
    except (TimeoutError, ApiError) as e:
        return emit({"ok": False, "error": "GUEST_FAILED", "message": str(e)}, EXIT_DOMAIN)
    except Exception as e:  # a crash: say so on stdout too, so the laptop sees one JSON object
        traceback.print_exc(file=sys.stderr)
        return emit({"ok": False, "error": "GUEST_FAILED", "message": "helper crashed: %s: %s" % (type(e).__name__, e)}, EXIT_CRASH)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
