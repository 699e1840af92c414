"""The guest helper (component/guest: the boxd_helper package and protocol.json) run
directly, without boxd, against a real `opencode serve` (pinned 1.18.33) and the scripted
model (host-bridge/tour/scripted-model.mjs). Every test runs it as it ships: one zipapp, made
from component/guest at the start of the module the way component/build.rs makes it.

    cd /work/main && python3 -m unittest discover -s tests/guest -v

Each test class is one guest: a temp HOME with its own XDG dirs, the scripted provider in the
global OpenCode config, and the config dir pre-seeded so OpenCode never runs npm. Tests inside
a class share that guest's server (starting one costs ~5 s on a 2-core box) and run in name
order. One scripted model serves every class. Every process a helper started (servers,
pumps) is found through the guests' state files (~/.boxd-helper/works) and killed by pid at the end, and at exit.
"""

import atexit
import base64
import hashlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import zipapp
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "component" / "guest"
HELPER = Path(tempfile.mkdtemp(prefix="boxd-helper-")) / "helper.pyz"
PROTOCOL = json.loads((SOURCE / "protocol.json").read_text())
MODEL = ROOT / "host-bridge" / "tour" / "scripted-model.mjs"
OPENCODE_VERSION = "1.18.33"
CONFIG = {
    "$schema": "https://opencode.ai/config.json",
    "provider": {
        "scripted": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "Scripted",
            "options": {"baseURL": "{env:SCRIPTED_MODEL_URL}", "apiKey": "{env:SCRIPTED_MODEL_KEY}"},
            "models": {"scripted-model": {"name": "Scripted", "tool_call": True}},
        }
    },
    "model": "scripted/scripted-model",
    "small_model": "scripted/scripted-model",
    "autoupdate": False,
    "share": "disabled",
}


def find_opencode():
    candidates = [os.environ.get("OPENCODE_BIN"), ROOT / "tests" / "node_modules" / ".bin" / "opencode",
                  Path("/work/oc-tools/node_modules/.bin/opencode")]
    for c in candidates:
        if c and os.access(str(c), os.X_OK):
            return Path(c)
    found = shutil.which("opencode")
    if found:
        return Path(found)
    raise RuntimeError("OpenCode %s is not installed: run `npm ci` in tests/ (or set OPENCODE_BIN)" % OPENCODE_VERSION)


# ----------------------------------------------------------------------------------------
# processes we own

_PIDS = set()
_GUESTS = []
_MODEL = {}


def _kill(pid):
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _cleanup():
    for g in list(_GUESTS):
        g.close()
    for pid in list(_PIDS):
        _kill(pid)
    proc = _MODEL.pop("proc", None)
    if proc:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        proc.stdout.close()


atexit.register(_cleanup)


def build_helper():
    """The zipapp of component/guest: its .py and .json files, like component/build.rs."""
    zipapp.create_archive(SOURCE, HELPER, filter=lambda p: p.suffix in (".py", ".json") and "__pycache__" not in p.parts)


def setUpModule():
    find_opencode()
    build_helper()
    log = Path(tempfile.mkdtemp(prefix="boxd-model-")) / "model.jsonl"
    proc = subprocess.Popen(["node", str(MODEL)], env={**os.environ, "PORT": "0", "MODEL_LOG": str(log)},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _MODEL["proc"] = proc
    line = proc.stdout.readline().decode()
    if "listening on" not in line:
        raise RuntimeError("the scripted model did not start: %r" % line)
    _MODEL["url"] = line.strip().rsplit(" ", 1)[-1]
    _MODEL["log"] = log


def tearDownModule():
    _cleanup()
    shutil.rmtree(HELPER.parent, ignore_errors=True)
    shutil.rmtree(_MODEL.get("log", Path("/nonexistent")).parent, ignore_errors=True)


# ----------------------------------------------------------------------------------------
# one guest = one temp HOME


def frame(data, digest=None):
    """One file as a frame: <size>\n<bytes><sha256 hex>\n."""
    return b"%d\n" % len(data) + data + (digest or hashlib.sha256(data).hexdigest()).encode() + b"\n"


def read_frames(raw):
    """Every frame of `raw`, each digest checked; the bytes must end with the last frame."""
    out = []
    while raw:
        header, _, raw = raw.partition(b"\n")
        size = int(header)
        data, trailer, raw = raw[:size], raw[size:size + 65], raw[size + 65:]
        assert trailer == hashlib.sha256(data).hexdigest().encode() + b"\n", "frame digest"
        out.append(data)
    return out


class Result:
    def __init__(self, rc, out, err, seconds):
        self.rc, self.err, self.seconds = rc, err, seconds
        self.raw = out
        first, _, rest = out.partition(b"\n")
        self.frames = []
        if rest and first.startswith(b"{") and isinstance(json.loads(first).get("files"), list):
            # git's answer, then the requested files' frames (docs/guest.md, "Frames")
            self.json, self.count = json.loads(first), 1
            self.frames = read_frames(rest)
            return
        lines = [l for l in out.decode("utf-8", "replace").splitlines() if l.strip()]
        self.json = json.loads(lines[-1]) if lines else None
        self.count = len(lines)

    def __repr__(self):
        return "Result(rc=%s, json=%s, stderr=%r)" % (self.rc, json.dumps(self.json)[:800], self.err[-800:])


class Guest:
    def __init__(self, name):
        self.root = Path(tempfile.mkdtemp(prefix="boxd-guest-%s-" % name))
        self.home = self.root / "home"
        dirs = {k: self.root / k for k in ("data", "config", "cache", "state", "tmp")}
        for d in [self.home, *dirs.values()]:
            d.mkdir(parents=True)
        cfg = dirs["config"] / "opencode"
        cfg.mkdir()
        (cfg / "opencode.json").write_text(json.dumps(CONFIG, indent=1))
        # skip OpenCode's npm install of @opencode-ai/plugin into the config dir (reference 8.6)
        (cfg / "node_modules").mkdir()
        (cfg / "package.json").write_text(json.dumps({"dependencies": {"@opencode-ai/plugin": OPENCODE_VERSION}}))
        (cfg / "package-lock.json").write_text(json.dumps(
            {"lockfileVersion": 3, "packages": {"": {"dependencies": {"@opencode-ai/plugin": OPENCODE_VERSION}}}}))
        self.env = {
            "PATH": "%s:%s" % (find_opencode().parent, os.environ.get("PATH", "/usr/bin:/bin")),
            "HOME": str(self.home),
            "XDG_DATA_HOME": str(dirs["data"]), "XDG_CONFIG_HOME": str(dirs["config"]),
            "XDG_CACHE_HOME": str(dirs["cache"]), "XDG_STATE_HOME": str(dirs["state"]),
            # the guest's own /tmp: OpenCode leaves a native library there at each server start
            "TMPDIR": str(dirs["tmp"]),
            "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "SCRIPTED_MODEL_URL": _MODEL["url"], "SCRIPTED_MODEL_KEY": "scripted-key",
            "LANG": "C.UTF-8", "GIT_CONFIG_NOSYSTEM": "1",
            # other test suites may load this machine: the helper must not judge it unwell
            "BOXD_HELPER_MACHINE": "well",
        }
        self.closed = False
        _GUESTS.append(self)

    # -- paths
    def tree(self, work):
        return self.home / "work" / work

    def boxd(self, work):
        return self.home / ".boxd-helper" / "works" / work

    def server(self, work):
        return json.loads((self.boxd(work) / "server.json").read_text())

    def pump_pid(self, work):
        return json.loads((self.boxd(work) / "pump.json").read_text())["pid"]

    def track(self):
        for f in self.home.glob(".boxd-helper/works/*/server.json"):
            try:
                _PIDS.add(json.loads(f.read_text())["pid"])
            except (OSError, ValueError, KeyError):
                pass
        for f in self.home.glob(".boxd-helper/works/*/pump.json"):
            try:
                _PIDS.add(json.loads(f.read_text())["pid"])
            except (OSError, ValueError, KeyError):
                pass

    # -- the helper
    def run(self, command, work, stdin=b"", *flags, timeout=150, env=None):
        if isinstance(stdin, str):
            stdin = stdin.encode("utf-8")
        elif isinstance(stdin, (dict, list)):
            stdin = json.dumps(stdin).encode("utf-8")
        t0 = time.monotonic()
        argv = [sys.executable, str(HELPER), command] + (["--work", work] if work else []) + list(flags)
        p = subprocess.run(argv, input=stdin, capture_output=True, env={**self.env, **(env or {})}, timeout=timeout,
                           cwd=str(self.home))
        self.track()
        return Result(p.returncode, p.stdout, p.stderr.decode("utf-8", "replace"), time.monotonic() - t0)

    def prepare(self, work, version=OPENCODE_VERSION, password="test-password"):
        return self.run("prepare", work, password + "\n", "--opencode-version", version)

    def submit(self, work, prompt, prompt_id=None, files=()):
        """files: file_item()s; the JSON line names them, their frames follow it."""
        self.seq = getattr(self, "seq", 0) + 1
        payload = {"promptId": prompt_id or "p%04d" % self.seq, "prompt": prompt, "files": [{"to": f["to"]} for f in files]}
        stdin = json.dumps(payload).encode("utf-8") + b"\n" + b"".join(frame(f["data"], f.get("sha256")) for f in files)
        return self.run("submit", work, stdin)

    def status(self, work):
        return self.run("status", work)

    def wait_idle(self, work, timeout=90):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.status(work)
            if last.rc == 0 and last.json["state"] == "idle":
                return last.json
            time.sleep(0.25)
        raise AssertionError("work %s did not become idle within %d s: %r" % (work, timeout, last))

    # -- direct HTTP to the work's server (what a test does behind the helper's back)
    def http(self, work, method, path, body=None):
        port = self.server(work)["port"]
        pw = (self.boxd(work) / "password").read_text()
        auth = base64.b64encode(("opencode:" + pw).encode()).decode()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body),
                         headers={"authorization": "Basic " + auth, "content-type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else None)
        finally:
            conn.close()

    def wait_opencode_busy(self, work, sid, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sid in (self.http(work, "GET", "/session/status")[1] or {}):
                return
            time.sleep(0.1)
        raise AssertionError("OpenCode never reported session %s busy" % sid)

    def close(self):
        if self.closed:
            return
        self.closed = True
        self.track()
        for f in list(self.home.glob(".boxd-helper/works/*/server.json")) + list(self.home.glob(".boxd-helper/works/*/pump.json")):
            try:
                pid = json.loads(f.read_text())["pid"]
            except (OSError, ValueError, KeyError):
                continue
            _kill(pid)
        time.sleep(0.2)
        shutil.rmtree(self.root, ignore_errors=True)
        if self in _GUESTS:
            _GUESTS.remove(self)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def read_proc(pid, name):
    try:
        with open("/proc/%s/%s" % (pid, name), "rb") as f:
            return f.read()
    except OSError:
        return b""


def pumps_of(home, work):
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        cmd = read_proc(p, "cmdline").replace(b"\0", b" ").decode("utf-8", "replace")
        if "pump --work %s" % work in cmd and str(home).encode() in read_proc(p, "environ"):
            found.append(int(p))
    return [p for p in found if alive(p)]


def wait_dead(pid, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.05)
    return not alive(pid)


def git(cwd, *args, check=True):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(cwd)}
    r = subprocess.run(["git", "-c", "init.defaultBranch=main", *args], cwd=str(cwd), capture_output=True, env=env)
    if check and r.returncode != 0:
        raise AssertionError("git %s: %s" % (" ".join(args), r.stderr.decode()))
    return r


def file_item(to, data):
    return {"to": to, "data": data}


# ----------------------------------------------------------------------------------------


class T1Commands(unittest.TestCase):
    """Command-line and domain checks that need no server."""

    @classmethod
    def setUpClass(cls):
        cls.g = Guest("cmd")

    @classmethod
    def tearDownClass(cls):
        cls.g.close()

    def test_version_mismatch_is_guest_version_with_both_versions(self):
        r = self.g.prepare("vers", version="0.0.1")
        self.assertEqual(r.rc, 3, r)
        self.assertEqual(r.json["error"], "GUEST_VERSION")
        self.assertIn(OPENCODE_VERSION, r.json["message"])
        self.assertIn("0.0.1", r.json["message"])
        self.assertFalse((self.g.boxd("vers") / "server.json").exists(), "no server may start on a version mismatch")
        self.assertEqual(r.count, 1, "exactly one JSON object on stdout")

    def test_bad_work_id_unknown_work_and_usage(self):
        r = self.g.run("status", "Bad_Id")
        self.assertEqual((r.rc, r.json["error"]), (3, "NAME_INVALID"), r)
        r = self.g.run("status", "never-prepared")
        self.assertEqual((r.rc, r.json["error"]), (3, "WORK_UNKNOWN"), r)
        # usage errors answer on stdout, where the component reads every answer; stderr stays empty
        for command, work in (("frobnicate", "alpha"), ("status", None), ("version", None)):
            r = self.g.run(command, work)
            self.assertEqual((r.rc, r.json["error"], r.count, r.err), (2, "ARGS_INVALID", 1, ""), r)
        r = self.g.run("git", "alpha", b"", "--files", "a.txt")
        self.assertEqual((r.rc, r.json["error"]), (2, "ARGS_INVALID"), "paths travel only on stdin: %r" % r)

    def test_the_zipapp_runs_through_a_symlinked_folder(self):
        # The zip's loader must find protocol.json under the path it was started with.
        linked = self.g.root / "linked"
        os.symlink(str(HELPER.parent), linked)
        p = subprocess.run([sys.executable, str(linked / HELPER.name), "git", "--work", "alpha"], capture_output=True,
                           env=self.g.env, timeout=60)
        r = Result(p.returncode, p.stdout, p.stderr.decode("utf-8", "replace"), 0)
        self.assertEqual((r.rc, r.json["error"], r.err), (3, "WORK_UNKNOWN", ""), r)

    def test_work_ids_follow_the_protocol(self):
        rule = PROTOCOL["workId"]
        self.assertEqual(rule["maxLength"], 40)
        for work, kind in (("a" * 40, "WORK_UNKNOWN"), ("w-1", "WORK_UNKNOWN"), ("a" * 41, "NAME_INVALID"),
                           ("ends-", "NAME_INVALID"), ("1st", "NAME_INVALID"), ("a_b", "NAME_INVALID")):
            r = self.g.run("git", work)
            self.assertEqual((r.rc, r.json["error"]), (3, kind), (work, r))
            if kind == "NAME_INVALID":
                self.assertIn("at most 40 characters", r.json["message"])

    def test_a_prompt_over_the_protocols_limit_is_file_too_large_and_admits_nothing(self):
        work = "bigprompt"
        (self.g.boxd(work) / "inbox").mkdir(parents=True)
        limit = PROTOCOL["limits"]["prompt"]["max"]
        self.assertEqual(limit, 4 * 1024 * 1024)
        r = self.g.submit(work, "x" * (limit + 1))
        self.assertEqual((r.rc, r.json["error"]), (3, "FILE_TOO_LARGE"), r)
        self.assertIn("4 MiB", r.json["message"])
        self.assertEqual(os.listdir(self.g.boxd(work) / "inbox"), [])

    def test_unwritable_home_is_guest_workspace(self):
        g = Guest("ws")
        try:
            (g.home / "work").write_text("a file where the work folder should be")
            r = g.prepare("alpha")
            self.assertEqual((r.rc, r.json["error"]), (3, "GUEST_WORKSPACE"), r)
        finally:
            g.close()

    def test_scripted_model_plain_json_errors_and_models(self):
        host, port = _MODEL["url"].split("//")[1].split("/")[0].split(":")

        def call(method, path, body=None):
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            try:
                conn.request(method, path, body=None if body is None else json.dumps(body),
                             headers={"content-type": "application/json"})
                resp = conn.getresponse()
                return resp.status, json.loads(resp.read()), resp.getheader("retry-after-ms")
            finally:
                conn.close()

        tools = [{"type": "function", "function": {"name": "write", "parameters": {}}}]
        status, body, _ = call("GET", "/v1/models")
        self.assertEqual((status, body["data"][0]["id"]), (200, "scripted-model"))
        prompt = 'go @@tool:write:{"filePath":"a.txt","content":"x"}@@ @@tool:nope:{}@@'
        status, body, _ = call("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], "tools": tools})
        call_ = body["choices"][0]["message"]["tool_calls"][0]
        self.assertEqual((status, call_["function"]["name"]), (200, "write"))
        self.assertEqual(json.loads(call_["function"]["arguments"]), {"filePath": "a.txt", "content": "x"})
        history = [{"role": "user", "content": prompt},
                   {"role": "assistant", "content": None, "tool_calls": [call_]},
                   {"role": "tool", "tool_call_id": call_["id"], "content": "Wrote file successfully."}]
        status, body, _ = call("POST", "/v1/chat/completions", {"messages": history, "tools": tools})
        self.assertEqual(body["choices"][0]["message"]["content"], "MODEL_DONE after write: Wrote file successfully.")
        status, body, retry = call("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x @@fail:401@@"}]})
        self.assertEqual((status, body["error"]["code"], retry), (401, "invalid_api_key", "20"))
        status, body, _ = call("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a  b\n c"}]}]})
        self.assertEqual(body["choices"][0]["message"]["content"], "MODEL_REPLY: a b c")
        title = [{"role": "system", "content": "You are a title generator."}, {"role": "user", "content": "@@fail:500@@"}]
        status, body, _ = call("POST", "/v1/chat/completions", {"messages": title})
        self.assertEqual((status, body["choices"][0]["message"]["content"]), (200, "Scripted session"))

    def test_git_states_patch_digests_and_requested_files(self):
        g, work = self.g, "gitw"
        tree = g.tree(work)
        (tree / ".boxd").mkdir(parents=True)
        (tree / ".boxd" / "password").write_text("secret")
        (tree / "README.md").write_text("hello\n")
        # not a repository yet: not an error
        r = g.run("git", work)
        self.assertEqual(r.rc, 0, r)
        self.assertFalse(r.json["repo"])
        self.assertIsNone(r.json["head"])
        # a repository with no commits: head and patch null, everything untracked (staged or not)
        git(tree, "init", "-q")
        (tree / "staged-first.txt").write_text("first\n")
        git(tree, "add", "staged-first.txt")
        r = g.run("git", work)
        self.assertEqual(r.rc, 0, r)
        j = r.json
        self.assertTrue(j["repo"])
        self.assertIsNone(j["head"])
        self.assertIsNone(j["patch"])
        self.assertEqual([e["path"] for e in j["untracked"]], ["README.md", "staged-first.txt"])
        self.assertEqual(j["untracked"][0]["sha256"], hashlib.sha256(b"hello\n").hexdigest())
        self.assertTrue(j["dirty"], "a staged file in a repository without commits")
        self.assertIn("/.boxd", (tree / ".git" / "info" / "exclude").read_text().splitlines())
        self.assertNotIn(".boxd", json.dumps(j))
        # commit, then make it dirty in every way
        (tree / ".gitignore").write_text("*.log\nbuild/\n")
        (tree / "src").mkdir()
        (tree / "src" / "keep.py").write_text("print('v1')\n")
        (tree / "gone.txt").write_text("bye\n")
        (tree / "blob.bin").write_bytes(bytes(range(256)) * 4)
        git(tree, "add", "-A")
        git(tree, "commit", "-qm", "base")
        head = git(tree, "rev-parse", "HEAD").stdout.decode().strip()
        (tree / "src" / "keep.py").write_text("print('v2')\nprint('ünïcode')\n")   # unstaged change
        (tree / "gone.txt").unlink()                                                 # deletion
        (tree / "blob.bin").write_bytes(bytes(reversed(range(256))) * 4)              # binary change
        (tree / "staged new.txt").write_text("staged\n")
        git(tree, "add", "staged new.txt")                                           # staged addition
        (tree / "notes ü.txt").write_text("untracked\n")                             # untracked
        (tree / "debug.log").write_text("ignored\n")                                 # ignored
        (tree / "build").mkdir()
        (tree / "build" / "out.o").write_bytes(b"\0\1")                             # ignored folder
        os.symlink("README.md", tree / "readme-link")                                 # untracked symlink
        r = g.run("git", work, {"files": ["src/keep.py", "blob.bin"]}, "--files-stdin")
        self.assertEqual(r.rc, 0, r)
        j = r.json
        self.assertEqual(j["head"], head)
        self.assertEqual(j["branch"], "main")
        self.assertTrue(j["dirty"])
        self.assertTrue(any(l.endswith("gone.txt") and l.startswith(" D") for l in j["status"]), j["status"])
        self.assertTrue(any("staged new.txt" in l and l.startswith("A ") for l in j["status"]), j["status"])
        untracked = {e["path"]: e for e in j["untracked"]}
        self.assertEqual(set(untracked), {"notes ü.txt", "readme-link"})
        self.assertEqual(untracked["notes ü.txt"]["sha256"], hashlib.sha256(b"untracked\n").hexdigest())
        self.assertEqual(untracked["notes ü.txt"]["size"], 10)
        self.assertTrue(untracked["readme-link"].get("symlink"))
        ignored = {e["path"]: e for e in j["ignored"]}
        self.assertEqual(set(ignored), {"debug.log", "build/"})
        self.assertEqual(ignored["debug.log"]["sha256"], hashlib.sha256(b"ignored\n").hexdigest())
        for key in ("status", "untracked", "ignored"):
            self.assertFalse(any(".boxd" in json.dumps(e) for e in j[key]), key)
        self.assertNotIn(".boxd", j["patch"])
        # requested files come back with the right bytes
        self.assertEqual([f["path"] for f in j["files"]], ["src/keep.py", "blob.bin"])
        for f, sent in zip(j["files"], r.frames):
            data = (tree / f["path"]).read_bytes()
            self.assertEqual(sent, data)
            self.assertEqual(f["size"], len(data))
        self.assertEqual(len(r.frames), 2)
        # the patch applies cleanly onto a fresh clone at HEAD and reproduces the tracked state
        clone = Path(tempfile.mkdtemp(prefix="boxd-clone-", dir=str(g.root)))
        git(g.root, "clone", "-q", str(tree), str(clone))
        (clone / "p.diff").write_text(j["patch"])
        git(clone, "apply", "--index", "p.diff")
        (clone / "p.diff").unlink()
        for rel in ("src/keep.py", "blob.bin", "staged new.txt"):
            self.assertEqual((clone / rel).read_bytes(), (tree / rel).read_bytes(), rel)
        self.assertFalse((clone / "gone.txt").exists())
        # refused and missing requests
        os.symlink("/etc/hostname", tree / "outside-link")
        for req, kind in (("outside-link", "PATH_REFUSED"), ("readme-link", "PATH_REFUSED"), ("../x", "PATH_REFUSED"),
                          ("/etc/hostname", "PATH_REFUSED"), (".boxd/password", "PATH_REFUSED"), ("src", "PATH_REFUSED"),
                          ("no/such.txt", "NAME_INVALID")):
            r = g.run("git", work, {"files": [req]}, "--files-stdin")
            self.assertEqual((r.rc, r.json["error"]), (3, kind), (req, r))
            self.assertIn(req.strip("/").split("/")[-1], r.json["message"])
        # any name travels on stdin, commas included
        (tree / "a,b.txt").write_text("comma\n")
        r = g.run("git", work, {"files": ["a,b.txt"]}, "--files-stdin")
        self.assertEqual(r.rc, 0, r)
        self.assertEqual(r.frames, [b"comma\n"])
        # size caps
        (tree / "big.bin").write_bytes(b"x" * (8 * 1024 * 1024 + 1))
        r = g.run("git", work, {"files": ["big.bin"]}, "--files-stdin")
        self.assertEqual((r.rc, r.json["error"]), (3, "FILE_TOO_LARGE"), r)
        (tree / "big.bin").unlink()

    def test_versions_staged_apart_are_named_by_their_real_paths(self):
        """`git add`, then the file changed again: the staged version is in no commit and no
        patch. Named by its real path (a space, a rename's new name); a mode changed after
        `git add` keeps the staged bytes in the file, and is not named."""
        g, work = self.g, "stagedw"
        tree = g.tree(work)
        tree.mkdir(parents=True)
        ident = ("-c", "user.email=t@t", "-c", "user.name=t")
        git(tree, "init", "-q")
        for name in ("a b.txt", "old.txt", "mode.sh", "same.txt"):
            (tree / name).write_text("v1\n")
        git(tree, "add", "-A")
        git(tree, *ident, "commit", "-qm", "base")
        (tree / "a b.txt").write_text("v2, staged\n")
        git(tree, "add", "a b.txt")
        (tree / "a b.txt").write_text("v3\n")
        git(tree, "mv", "old.txt", "new.txt")
        (tree / "new.txt").write_text("renamed, then changed\n")
        (tree / "mode.sh").write_text("v2\n")
        git(tree, "add", "mode.sh")
        os.chmod(tree / "mode.sh", 0o755)
        # A rename in the tree's column (` R`: moved, the new name marked with `git add -N`)
        # carries its old name too, which is not a record of its own.
        os.rename(tree / "same.txt", tree / "moved.txt")
        git(tree, "add", "-N", "moved.txt")
        r = g.run("git", work, {"files": [], "haveRefs": {}}, "--files-stdin")
        self.assertEqual(r.rc, 0, r)
        self.assertEqual(sorted(r.json["stagedApart"]), ["a b.txt", "new.txt"], r.json["status"])

    def test_git_sees_hidden_edits_older_stashes_and_dirty_linked_worktrees(self):
        g, work = self.g, "hiddenw"
        tree = g.tree(work)
        tree.mkdir(parents=True)
        ident = ("-c", "user.email=t@t", "-c", "user.name=t")
        git(tree, "init", "-q")
        for name in ("a.txt", "b.txt", "c.txt"):
            (tree / name).write_text("v1\n")
        git(tree, "add", "-A")
        git(tree, *ident, "commit", "-qm", "base")
        # two stash entries: the older one lives only in the stash's reflog
        stashed = []
        for text in ("first stash\n", "second stash\n"):
            (tree / "c.txt").write_text(text)
            git(tree, *ident, "stash", "-q")
            stashed.append(git(tree, "rev-parse", "refs/stash").stdout.decode().strip())
        # edits hidden from status by index flags
        git(tree, "update-index", "--skip-worktree", "a.txt")
        git(tree, "update-index", "--assume-unchanged", "b.txt")
        (tree / "a.txt").write_text("hidden edit a\n")
        (tree / "b.txt").write_text("hidden edit b\n")
        # a linked work tree with an uncommitted file
        linked = tree.parent / "hiddenw-feature"
        git(tree, "worktree", "add", "-q", "-b", "feature", str(linked))
        (linked / "design.md").write_text("draft\n")
        r = g.run("git", work, {"files": [], "haveRefs": {}}, "--files-stdin")
        self.assertEqual(r.rc, 0, r)
        j = r.json
        self.assertTrue(j["dirty"], j["status"])
        self.assertIn("hidden edit a", j["patch"])
        self.assertIn("hidden edit b", j["patch"])
        for sha in stashed:
            self.assertEqual(j["refs"].get("refs/boxd-stash/" + sha), sha, j["refs"])
        fresh = Path(tempfile.mkdtemp(prefix="boxd-stash-", dir=str(g.root)))
        (fresh / "w.bundle").write_bytes(base64.b64decode(j["bundle"]["data"]))
        git(fresh, "init", "-q")
        git(fresh, "fetch", "-q", str(fresh / "w.bundle"), "refs/*:refs/b/*")
        for sha in stashed:
            self.assertEqual(git(fresh, "cat-file", "-t", sha).stdout.decode().strip(), "commit", sha)
        self.assertEqual(j["worktrees"], [str(linked)])
        # the repository's own index keeps its flags
        flags = git(tree, "ls-files", "-v").stdout.decode().split("\n")
        self.assertIn("S a.txt", flags)
        self.assertIn("h b.txt", flags)
        # a commit on a detached HEAD in a linked work tree travels as a ref of ours; a stash
        # dropped since no longer keeps one
        (linked / "design.md").unlink()
        git(linked, "checkout", "-q", "--detach")
        (linked / "d.txt").write_text("detached\n")
        git(linked, "add", "d.txt")
        git(linked, *ident, "commit", "-qm", "detached work")
        detached = git(linked, "rev-parse", "HEAD").stdout.decode().strip()
        git(tree, "stash", "drop", "-q", "stash@{1}")
        r = g.run("git", work, {"files": [], "haveRefs": {}}, "--files-stdin")
        self.assertEqual(r.rc, 0, r)
        self.assertEqual(r.json["refs"].get("refs/boxd-worktree/" + detached), detached, r.json["refs"])
        self.assertNotIn("refs/boxd-stash/" + stashed[0], r.json["refs"])
        self.assertIn("refs/boxd-stash/" + stashed[1], r.json["refs"])
        self.assertEqual(r.json["worktrees"], [])
        # an edit hidden by the linked work tree's own index flags still makes it dirty
        for flag, name in (("--skip-worktree", "d.txt"), ("--assume-unchanged", "a.txt")):
            git(linked, "update-index", flag, name)
            (linked / name).write_text("hidden in the linked tree\n")
            r = g.run("git", work, {"files": [], "haveRefs": {}}, "--files-stdin")
            self.assertEqual(r.rc, 0, r)
            self.assertEqual(r.json["worktrees"], [str(linked)], flag)
            git(linked, "update-index", flag.replace("--", "--no-"), name)
            git(linked, "checkout", "-q", "--", name)
        self.assertEqual(git(linked, "status", "--porcelain").stdout, b"")
        r = g.run("git", work, {"files": [], "haveRefs": {}}, "--files-stdin")
        self.assertEqual(r.json["worktrees"], [], "clean again")

    def test_git_sends_every_commit_as_a_verified_bundle_unless_the_laptop_has_it(self):
        g, work = self.g, "bundlew"
        tree = g.tree(work)
        tree.mkdir(parents=True)
        git(tree, "init", "-q")
        (tree / "a.txt").write_text("one\n")
        git(tree, "add", "-A")
        git(tree, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one")
        git(tree, "checkout", "-qb", "side")
        (tree / "b.txt").write_text("side\n")
        (tree / "HEAD").write_text("a file the agent named HEAD is no revision\n")
        git(tree, "add", "-A")
        git(tree, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "side")
        r = g.run("git", work, {"files": [], "haveRefs": {}}, "--files-stdin")
        self.assertEqual(r.rc, 0, r)
        refs = r.json["refs"]
        self.assertEqual(refs["HEAD"], git(tree, "rev-parse", "HEAD").stdout.decode().strip())
        self.assertIn("refs/heads/side", refs)
        data = base64.b64decode(r.json["bundle"]["data"])
        self.assertEqual(r.json["bundle"]["sha256"], hashlib.sha256(data).hexdigest())
        # a fresh repository takes every branch from it
        fresh = Path(tempfile.mkdtemp(prefix="boxd-bundle-", dir=str(g.root)))
        (fresh / "w.bundle").write_bytes(data)
        git(fresh, "init", "-q")
        git(fresh, "fetch", "-q", str(fresh / "w.bundle"), "refs/heads/*:refs/remotes/b/*")
        self.assertEqual(git(fresh, "rev-parse", "refs/remotes/b/side").stdout.decode().strip(), refs["refs/heads/side"])
        # the laptop already holds these refs: no bundle travels
        r = g.run("git", work, {"files": [], "haveRefs": refs}, "--files-stdin")
        self.assertEqual(r.rc, 0, r)
        self.assertTrue(r.json.get("bundleUnchanged"), r)
        self.assertNotIn("bundle", r.json)


class OneWork(unittest.TestCase):
    """A suite on one guest with one prepared work (W), shared by its tests in order."""

    W = None
    GUEST = None

    @classmethod
    def setUpClass(cls):
        cls.g = Guest(cls.GUEST)
        cls.first = cls.g.prepare(cls.W)

    @classmethod
    def tearDownClass(cls):
        cls.g.close()

    def setUp(self):
        if self.first.rc != 0:
            self.fail("prepare failed: %r" % (self.first,))


class T2Lifecycle(OneWork):
    """One guest, one work, one server: the whole prompt lifecycle."""

    W = "alpha"
    GUEST = "life"

    def run_prompt(self, prompt, **kw):
        r = self.g.submit(self.W, prompt, **kw)
        self.assertEqual(r.rc, 0, r)
        self.assertTrue(r.json["admitted"])
        return r, self.g.wait_idle(self.W)

    def test_01_prepare_detaches_and_is_idempotent(self):
        g, j = self.g, self.first.json
        self.assertEqual(self.first.count, 1)
        self.assertTrue(j["serverStarted"])
        self.assertEqual(j["opencodeVersion"], OPENCODE_VERSION)
        self.assertLess(self.first.seconds, 60, "prepare must return once the server listens")
        server = g.server(self.W)
        self.assertEqual(server["port"], j["port"])
        self.assertTrue(alive(server["pid"]), "the server outlives the prepare call")
        self.assertTrue(alive(g.pump_pid(self.W)), "the pump outlives the prepare call")
        pw = g.boxd(self.W) / "password"
        self.assertEqual(pw.stat().st_mode & 0o777, 0o600)
        self.assertEqual(pw.read_text(), "test-password")
        self.assertNotIn(b"test-password", read_proc(server["pid"], "cmdline"))
        # again: nothing to do
        again = g.prepare(self.W)
        self.assertEqual(again.rc, 0, again)
        self.assertFalse(again.json["serverStarted"])
        self.assertEqual(again.json["port"], j["port"])
        self.assertEqual(g.server(self.W)["pid"], server["pid"])
        self.assertLess(again.seconds, 15)
        # a claim (the laptop took the machine up by its name alone) by another password's
        # digest: another ledger's, refused with nothing changed; this password's is ours
        sha = lambda p: hashlib.sha256(p.encode()).hexdigest()
        other = g.run("claim", self.W, b"", "--sha256", sha("another-ledger"))
        self.assertEqual((other.rc, other.json["error"]), (3, "NOT_OURS"), other)
        self.assertEqual(pw.read_text(), "test-password")
        self.assertEqual(g.server(self.W)["pid"], server["pid"])
        ours = g.run("claim", self.W, b"", "--sha256", sha("test-password"))
        self.assertEqual((ours.rc, ours.json["claimed"]), (0, True), ours)
        fresh = g.run("claim", "never-prepared", b"", "--sha256", sha("x"))
        self.assertEqual(fresh.rc, 0, fresh)
        self.assertFalse((g.home / ".boxd-helper" / "works" / "never-prepared").exists(), "a claim writes nothing")
        # exactly one pump
        self.assertEqual(len(pumps_of(g.home, self.W)), 1)
        # the tree becomes a repository later: .boxd is excluded on the next command
        git(g.tree(self.W), "init", "-q")
        st = g.status(self.W)
        self.assertEqual(st.rc, 0, st)
        self.assertIn("/.boxd", (g.tree(self.W) / ".git" / "info" / "exclude").read_text().splitlines())
        porcelain = git(g.tree(self.W), "status", "--porcelain", "--untracked-files=all").stdout.decode()
        self.assertNotIn(".boxd", porcelain)

    def test_02_submit_runs_to_completion(self):
        before = self.g.status(self.W).json
        r = self.g.submit(self.W, "hello   there\nfriend")
        self.assertEqual(r.rc, 0, r)
        busy = self.g.status(self.W).json      # the first prompt of a fresh server takes seconds
        self.assertEqual((busy["state"], busy["outcome"], busy["running"]["promptId"]), ("busy", None, "p0001"))
        st = self.g.wait_idle(self.W)
        self.assertFalse(r.json["queued"])
        self.assertEqual(r.json["pending"], 0)
        self.assertTrue(r.json["sessionId"].startswith("ses_"))
        self.assertEqual(st["outcome"], "completed")
        self.assertEqual(st["lastText"], "MODEL_REPLY: hello there friend")
        self.assertEqual(st["runs"], before["runs"] + 1)
        self.assertEqual(st["sessionId"], r.json["sessionId"])
        self.assertIsNone(st["failure"])
        self.assertFalse(st["interrupted"])
        self.assertEqual(st["server"], "up")
        self.assertTrue(st["lastActivityAt"].endswith("Z"))
        self.assertEqual((self.g.boxd(self.W) / "session").read_text().strip(), st["sessionId"])

    def test_03_second_prompt_waits_for_the_first(self):
        before = self.g.status(self.W).json
        a = self.g.submit(self.W, "@@sleep:2500@@ first of two")
        self.assertEqual(a.rc, 0, a)
        self.assertFalse(a.json["queued"])
        b = self.g.submit(self.W, "second of two", prompt_id="second-of-two")
        self.assertEqual(b.rc, 0, b)
        self.assertTrue(b.json["queued"])
        self.assertEqual(b.json["pending"], 1)
        self.assertLess(b.seconds, 10, "submit returns without waiting for the model")
        busy = self.g.status(self.W).json
        self.assertEqual(busy["state"], "busy")
        st = self.g.wait_idle(self.W)
        self.assertEqual(st["runs"], before["runs"] + 2)
        self.assertEqual(st["outcome"], "completed")
        self.assertEqual(st["lastText"], "MODEL_REPLY: second of two")
        self.assertEqual(st["pending"], 0)
        sid = st["sessionId"]
        users = [m for m in self.g.http(self.W, "GET", "/session/%s/message" % sid)[1] if m["info"]["role"] == "user"]
        texts = [p["text"] for m in users[-2:] for p in m["parts"] if p["type"] == "text"]
        self.assertEqual(texts, ["@@sleep:2500@@ first of two", "second of two"])
        # a retried submit (same promptId) is not run twice
        dup = self.g.submit(self.W, "second of two", prompt_id="second-of-two")
        self.assertTrue(dup.json.get("duplicate"), dup)
        self.assertEqual(self.g.wait_idle(self.W)["runs"], st["runs"])

    def test_04_failed_runs(self):
        _, st = self.run_prompt("break please @@fail:500@@")
        self.assertEqual(st["outcome"], "failed")
        self.assertEqual(st["failure"]["kind"], "other")
        self.assertIn("500", st["failure"]["message"])
        _, st = self.run_prompt("who am i @@fail:401@@")
        self.assertEqual(st["outcome"], "failed")
        self.assertEqual(st["failure"]["kind"], "auth")
        _, st = self.run_prompt("all good again")
        self.assertEqual(st["outcome"], "completed")
        self.assertIsNone(st["failure"])

    def test_05_aborted_run(self):
        r = self.g.submit(self.W, "@@sleep:30000@@ hold on")
        self.assertEqual(r.rc, 0, r)
        sid = r.json["sessionId"]
        self.g.wait_opencode_busy(self.W, sid)
        self.assertEqual(self.g.http(self.W, "POST", "/session/%s/abort" % sid, {})[0], 200)
        st = self.g.wait_idle(self.W, timeout=30)
        self.assertEqual(st["outcome"], "aborted")
        self.assertFalse(st["interrupted"])

    def test_06_prompts_arrive_byte_for_byte(self):
        nasty = ("@@echo-bytes@@ \"double\" 'single' `uname` $(id) ${HOME} $HOME \\ \\n; | & && || > < * ? ~ # !\n"
                 "second line\r\n\ttabbed   spaced  \n\u00fcn\u00efc\u00f6de \u65e5\u672c\u8a9e \U0001f600 \u200b end\n\n")
        _, st = self.run_prompt(nasty)
        data = nasty.encode("utf-8")
        self.assertEqual(st["lastText"], "ECHO_BYTES sha256=%s bytes=%d" % (hashlib.sha256(data).hexdigest(), len(data)))
        big = "@@echo-bytes@@\n" + ("0123456789abcdef\u00e9" * 61681)[: 1024 * 1024]
        r, st = self.run_prompt(big)
        self.assertGreaterEqual(len(big.encode()), 1024 * 1024)
        data = big.encode("utf-8")
        self.assertEqual(st["lastText"], "ECHO_BYTES sha256=%s bytes=%d" % (hashlib.sha256(data).hexdigest(), len(data)))

    def test_07_files_land_and_bad_targets_are_refused(self):
        g, tree = self.g, self.g.tree(self.W)
        blob = bytes(range(256)) * 33
        files = [file_item("docs/with space/na\u00efve \u00fc.txt", "caf\u00e9\n".encode()),
                 file_item("\u65e5\u672c/\u30c7\u30fc\u30bf.bin", blob),
                 file_item("top.txt", b"v1\n")]
        r, st = self.run_prompt("files are there", files=files)
        self.assertEqual(r.json["files"], 3)
        self.assertEqual((tree / "docs/with space/na\u00efve \u00fc.txt").read_bytes(), "caf\u00e9\n".encode())
        self.assertEqual((tree / "\u65e5\u672c/\u30c7\u30fc\u30bf.bin").read_bytes(), blob)
        self.assertEqual((tree / "top.txt").read_bytes(), b"v1\n")
        self.assertEqual(st["outcome"], "completed")
        # a retried submit (its answer was lost) whose files the agent has changed since:
        # admitted once, and the files are not put back over the agent's work
        first = g.submit(self.W, "keep my edits", prompt_id="files-retry", files=[file_item("retry.txt", b"as sent\n")])
        self.assertNotIn("duplicate", first.json, first)
        g.wait_idle(self.W)
        (tree / "retry.txt").write_bytes(b"the agent's edit\n")
        again = g.submit(self.W, "keep my edits", prompt_id="files-retry", files=[file_item("retry.txt", b"as sent\n")])
        self.assertTrue(again.json.get("duplicate"), again)
        self.assertEqual((tree / "retry.txt").read_bytes(), b"the agent's edit\n")
        self.assertEqual([p.name for p in (g.boxd(self.W) / "tmp").glob("in-*")], [], "no received temp left")
        # refusals admit nothing and write nothing
        outside = g.root / "outside"
        outside.mkdir()
        os.symlink(str(outside / "target.txt"), tree / "link.txt")
        os.symlink(str(outside), tree / "linkdir")
        state_before = json.loads((g.boxd(self.W) / "state.json").read_text())
        for to, kind in (("../escape.txt", "NAME_INVALID"), ("/tmp/abs.txt", "NAME_INVALID"),
                         ("a/../../x.txt", "NAME_INVALID"), ("link.txt", "NAME_INVALID"),
                         ("linkdir/x.txt", "NAME_INVALID"), (".boxd/evil", "NAME_INVALID"), ("", "NAME_INVALID")):
            r = g.submit(self.W, "must not run", files=[file_item("ok.txt", b"ok"), file_item(to, b"evil")])
            self.assertEqual((r.rc, r.json["error"]), (3, kind), (to, r))
        bad = file_item("top.txt", b"v2\n")
        bad["sha256"] = "0" * 64
        r = g.submit(self.W, "must not run", files=[bad])
        self.assertEqual((r.rc, r.json["error"]), (3, "ARGS_INVALID"), r)
        self.assertEqual(os.listdir(outside), [])
        self.assertFalse((tree / "ok.txt").exists())
        self.assertEqual((tree / "top.txt").read_bytes(), b"v1\n")
        self.assertFalse((g.root / "escape.txt").exists())
        state_after = json.loads((g.boxd(self.W) / "state.json").read_text())
        self.assertEqual(state_after["nextSeq"], state_before["nextSeq"])
        self.assertEqual(state_after["runs"], state_before["runs"])
        os.unlink(tree / "link.txt")
        os.unlink(tree / "linkdir")

    def test_08_task_tool_export_is_a_tree_parents_first(self):
        prompt = ('summarise @@tool:write:{"filePath":"SUMMARY.md","content":"# Summary\\nall good\\n"}@@ then '
                  '@@task:{"description":"child work","prompt":"child says hello","subagent_type":"general"}@@')
        _, st = self.run_prompt(prompt)
        self.assertEqual(st["outcome"], "completed", st)
        self.assertTrue(st["lastText"].startswith("MODEL_DONE after task:"), st["lastText"])
        self.assertIn("MODEL_REPLY: child says hello", st["lastText"])
        self.assertEqual((self.g.tree(self.W) / "SUMMARY.md").read_text(), "# Summary\nall good\n")
        r = self.g.run("export", self.W)
        self.assertEqual(r.rc, 0, r)
        sessions = r.json["sessions"]
        self.assertGreaterEqual(len(sessions), 2)
        root = sessions[0]
        self.assertEqual(root["info"]["id"], st["sessionId"])
        self.assertNotIn("parentID", root["info"])
        ids = [s["info"]["id"] for s in sessions]
        for i, s in enumerate(sessions[1:], 1):
            self.assertIn(s["info"].get("parentID"), ids[:i], "parents come before children")
            self.assertTrue(s["messages"])
        child = [s for s in sessions if s["info"].get("parentID") == root["info"]["id"]]
        self.assertEqual(len(child), 1)
        self.assertTrue(any(p.get("text") == "MODEL_REPLY: child says hello"
                            for m in child[0]["messages"] for p in m["parts"]))
        # the same content as OpenCode's own API
        self.assertEqual(root["messages"], self.g.http(self.W, "GET", "/session/%s/message" % ids[0])[1])
        type(self).exported = r.json
        # busy -> SESSION_BUSY
        r = self.g.submit(self.W, "@@sleep:1500@@ busy now")
        self.assertEqual(r.rc, 0, r)
        r = self.g.run("export", self.W)
        self.assertEqual((r.rc, r.json["error"]), (3, "SESSION_BUSY"), r)
        self.g.wait_idle(self.W)

    def test_09_state_survives_a_frozen_machine(self):
        g = self.g
        r = g.submit(self.W, "@@sleep:1500@@ frozen and thawed")
        self.assertEqual(r.rc, 0, r)
        pids = [g.server(self.W)["pid"], g.pump_pid(self.W)]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(3)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        st = g.wait_idle(self.W)
        self.assertEqual(st["outcome"], "completed")
        self.assertEqual(st["lastText"], "MODEL_REPLY: @@sleep:1500@@ frozen and thawed")
        self.assertEqual(g.server(self.W)["pid"], pids[0], "a thawed server is not restarted")

    def test_10_queue_survives_a_pump_restart_and_a_helper_upgrade(self):
        g = self.g
        before = g.status(self.W).json
        a = g.submit(self.W, "@@sleep:1500@@ before the pump dies", prompt_id="pump-a")
        b = g.submit(self.W, "queued across pumps")
        self.assertEqual((a.rc, b.rc, b.json["pending"]), (0, 0, 1), (a, b))
        old = g.pump_pid(self.W)
        os.kill(old, signal.SIGKILL)
        self.assertTrue(wait_dead(old))
        state = json.loads((g.boxd(self.W) / "state.json").read_text())
        self.assertEqual(state["current"]["promptId"], "pump-a")
        self.assertEqual(len(os.listdir(g.boxd(self.W) / "inbox")), 1, "the queued prompt waits on disk")
        # a newer helper (another file, as an upload of a new version would be) takes over the pump
        newer = g.root / "helper-newer.pyz"
        shutil.copy(HELPER, newer)
        env = dict(g.env)
        p = subprocess.run([sys.executable, str(newer), "status", "--work", self.W], capture_output=True, env=env, timeout=60)
        g.track()
        self.assertEqual(p.returncode, 0, p)
        info = json.loads((g.boxd(self.W) / "pump.json").read_text())
        self.assertEqual(info["script"], str(newer.resolve()))
        self.assertNotEqual(info["pid"], old)
        self.assertEqual(len(pumps_of(g.home, self.W)), 1)
        st = g.wait_idle(self.W)
        self.assertEqual(st["runs"], before["runs"] + 2)
        self.assertEqual(st["lastText"], "MODEL_REPLY: queued across pumps")
        # and back to this helper: the pump of the other version is replaced
        st = g.status(self.W)
        self.assertEqual(st.rc, 0, st)
        self.assertEqual(json.loads((g.boxd(self.W) / "pump.json").read_text())["script"], str(HELPER.resolve()))
        self.assertEqual(len(pumps_of(g.home, self.W)), 1)

    def test_11_import_rebuilds_the_transcript_on_a_fresh_guest(self):
        exported = getattr(type(self), "exported", None)
        if not exported:
            self.skipTest("needs the export of test_08")
        fresh = Guest("import")
        try:
            p = fresh.prepare(self.W)
            self.assertEqual(p.rc, 0, p)
            r = fresh.run("import", self.W, exported)
            self.assertEqual(r.rc, 0, r)
            self.assertEqual(r.json["imported"], len(exported["sessions"]))
            root = exported["sessions"][0]["info"]["id"]
            self.assertEqual(r.json["sessionId"], root)
            again = fresh.run("export", self.W)
            self.assertEqual(again.rc, 0, again)
            self.assertEqual([s["info"]["id"] for s in again.json["sessions"]],
                             [s["info"]["id"] for s in exported["sessions"]])
            for a, b in zip(again.json["sessions"], exported["sessions"]):
                self.assertEqual([m["info"]["id"] for m in a["messages"]], [m["info"]["id"] for m in b["messages"]])
                self.assertEqual(a["info"].get("parentID"), b["info"].get("parentID"))
                self.assertEqual(a["info"]["directory"], str(fresh.tree(self.W)))
            # the imported root is the work's session: the next prompt continues it
            s = fresh.submit(self.W, "after the rebuild")
            self.assertEqual(s.rc, 0, s)
            self.assertEqual(s.json["sessionId"], root)
            st = fresh.wait_idle(self.W)
            self.assertEqual((st["outcome"], st["lastText"]), ("completed", "MODEL_REPLY: after the rebuild"))
        finally:
            fresh.close()


    def test_12_asks_nobody_can_answer_are_declined_and_the_run_finishes(self):
        # A headless guest has nobody to approve a permission ask or answer a question: left
        # alone, the run would stay busy for ever and the work could not be harvested.
        outside = self.g.root / "outside.txt"
        outside.write_text("not the work's\n")
        read = json.dumps({"filePath": str(outside)})
        _, st = self.run_prompt("look @@tool:read:%s@@" % read)
        self.assertEqual(st["outcome"], "completed", st)
        self.assertIn("runs headless", st["lastText"], "the model was told why")
        self.assertEqual([d.get("permission") for d in st["declined"]], ["external_directory"], st)
        self.assertTrue(st["declined"][0]["patterns"][0].startswith(str(self.g.root)), st)
        q = {"questions": [{"question": "Which one?", "header": "Pick",
                            "options": [{"label": "a", "description": "A"}, {"label": "b", "description": "B"}]}]}
        _, st = self.run_prompt("ask @@tool:question:%s@@" % json.dumps(q))
        self.assertEqual(st["outcome"], "completed", "a question answered in words lets the run go on")
        self.assertEqual(st["declined"], [{"question": "Which one?"}], st)
        self.assertEqual(self.g.http(self.W, "GET", "/permission")[1], [])
        self.assertEqual(self.g.http(self.W, "GET", "/question")[1], [])
        # A run that asks nothing has nothing declined.
        _, st = self.run_prompt("plain")
        self.assertNotIn("declined", st)

class T4Seal(OneWork):
    """prepare makes a repository; resolve answers for prompt ids; seal stops the guest and
    reads the tree, and the next command starts it again without calling it a restart."""

    W = "sealw"
    GUEST = "seal"

    def test_1_prepare_made_a_repository_with_a_first_commit(self):
        tree = self.g.tree(self.W)
        self.assertEqual(self.first.json["repo"], "created")
        self.assertEqual(git(tree, "rev-list", "--count", "HEAD").stdout.decode().strip(), "1")
        again = self.g.prepare(self.W)
        self.assertEqual(again.json["repo"], "existing")
        # the agent's own commits work: the repository has an identity of its own
        self.assertEqual(git(tree, "config", "--local", "user.email").stdout.decode().strip(), "opencode-boxd@localhost")
        (tree / "x.txt").write_text("x\n")
        git(tree, "add", "x.txt")
        git(tree, "commit", "-qm", "by the agent")

    def test_2_resolve_says_which_prompts_arrived(self):
        r = self.g.submit(self.W, "hello", prompt_id="pknown")
        self.assertEqual(r.rc, 0, r)
        self.g.wait_idle(self.W)
        r = self.g.run("status", self.W, b"", "--resolve", "pknown,pnever")
        self.assertEqual(r.rc, 0, r)
        self.assertEqual(r.json["resolved"], {"pknown": True, "pnever": False})
        again = self.g.submit(self.W, "hello", prompt_id="pknown")
        self.assertTrue(again.json.get("duplicate"), again)

    def test_3_seal_stops_the_guest_and_reads_the_tree(self):
        tree = self.g.tree(self.W)
        server_pid, pump_pid = self.g.server(self.W)["pid"], self.g.pump_pid(self.W)
        (tree / "x.txt").write_text("changed\n")
        (tree / "new.txt").write_text("new\n")
        r = self.g.run("seal", self.W)
        self.assertEqual(r.rc, 0, r)
        j = r.json
        self.assertTrue(j["sealed"])
        self.assertEqual(j["newestPrompt"], "pknown")
        self.assertTrue(j["dirty"])
        self.assertIn("x.txt", j["changed"])
        self.assertEqual([e["path"] for e in j["untracked"]], ["new.txt"])
        diff = git(tree, "diff", "HEAD", "--binary", "--full-index", "--no-color", "--no-ext-diff", "--no-textconv",
                   "--src-prefix=a/", "--dst-prefix=b/", "--", ".", ":(exclude).boxd").stdout
        self.assertEqual(j["diffSha256"], hashlib.sha256(diff).hexdigest())
        self.assertEqual(j["refs"]["HEAD"], git(tree, "rev-parse", "HEAD").stdout.decode().strip())
        for pid in (server_pid, pump_pid):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and os.path.exists("/proc/%d" % pid):
                time.sleep(0.1)
            self.assertFalse(os.path.exists("/proc/%d" % pid), "process %d still runs after seal" % pid)
        # the next command starts it again as a fresh start, not GUEST_SERVER_DOWN
        st = self.g.status(self.W)
        self.assertEqual(st.rc, 0, st)
        self.assertEqual(st.json["server"], "up")
        # a submit right after a seal (a drop may be removing the machine) is refused, and
        # writes nothing
        r = self.g.submit(self.W, "too late", files=[file_item("late.txt", b"x")])
        self.assertEqual((r.rc, r.json["error"]), (3, "SESSION_BUSY"), r)
        self.assertFalse((tree / "late.txt").exists())

    def test_4_seal_refuses_a_busy_work_and_stops_nothing(self):
        p = self.g.prepare(self.W)  # ensure/resume reopen a sealed work
        self.assertEqual(p.rc, 0, p)
        r = self.g.submit(self.W, "slow @@sleep:4000@@")
        self.assertEqual(r.rc, 0, r)
        pid = self.g.server(self.W)["pid"]
        s = self.g.run("seal", self.W)
        self.assertEqual((s.rc, s.json["error"]), (3, "SESSION_BUSY"), s)
        self.assertTrue(os.path.exists("/proc/%d" % pid), "a refused seal stops nothing")
        self.g.wait_idle(self.W)


class T3ServerLoss(OneWork):
    """The server dies or hangs: restart, interruption reported once, hung detection."""

    W = "beta"
    GUEST = "loss"

    def test_1_server_killed_while_idle_is_restarted(self):
        g = self.g
        r = g.submit(self.W, "warm up")
        self.assertEqual(r.rc, 0, r)
        self.assertEqual(g.wait_idle(self.W)["outcome"], "completed")
        old = g.server(self.W)
        os.kill(old["pid"], signal.SIGKILL)
        self.assertTrue(wait_dead(old["pid"]))
        st = g.status(self.W)
        self.assertEqual((st.rc, st.json["error"]), (3, "GUEST_SERVER_DOWN"), st)
        self.assertIn("restarted", st.json["message"])
        self.assertEqual(st.json["server"], "restarted")
        new = g.server(self.W)
        self.assertNotEqual(new["pid"], old["pid"])
        self.assertTrue(alive(new["pid"]))
        st = g.status(self.W)
        self.assertEqual(st.rc, 0, st)
        self.assertEqual((st.json["server"], st.json["state"], st.json["outcome"]), ("up", "idle", "completed"))
        self.assertFalse(st.json["interrupted"])

    def test_2_server_killed_mid_run_is_reported_once(self):
        g = self.g
        r = g.submit(self.W, "@@sleep:30000@@ doomed")
        self.assertEqual(r.rc, 0, r)
        sid = r.json["sessionId"]
        g.wait_opencode_busy(self.W, sid)
        pid = g.server(self.W)["pid"]
        os.kill(pid, signal.SIGKILL)
        self.assertTrue(wait_dead(pid))
        st = g.status(self.W)
        self.assertEqual((st.rc, st.json["error"]), (3, "RUN_INTERRUPTED"), st)
        self.assertTrue(alive(g.server(self.W)["pid"]), "the status that reports the interruption restarts the server")
        st = g.status(self.W)
        self.assertEqual(st.rc, 0, st)
        self.assertEqual((st.json["state"], st.json["outcome"], st.json["interrupted"]), ("idle", "aborted", True))
        st = g.status(self.W)
        self.assertEqual((st.rc, st.json["outcome"]), (0, "aborted"))
        # and the work goes on in the same session
        r = g.submit(self.W, "recovered")
        self.assertEqual(r.rc, 0, r)
        self.assertEqual(r.json["sessionId"], sid)
        st = g.wait_idle(self.W)
        self.assertEqual((st["outcome"], st["lastText"], st["interrupted"]), ("completed", "MODEL_REPLY: recovered", False))

    def test_3_hung_server_is_not_restarted(self):
        g = self.g
        pid = g.server(self.W)["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            st = g.status(self.W)
            short = g.run("status", self.W, env={"BOXD_HELPER_MACHINE": "short-of-memory"})
            busy = g.run("status", self.W, env={"BOXD_HELPER_MACHINE": "overloaded"})
        finally:
            os.kill(pid, signal.SIGCONT)
        self.assertEqual((st.rc, st.json["error"]), (3, "GUEST_FAILED"), st)
        self.assertIn("did not answer", st.json["message"])
        for r in (short, busy):
            self.assertEqual((r.rc, r.json["error"]), (3, "GUEST_UNRESPONSIVE"), r)
            self.assertIn("largest processes", r.json["message"])
            self.assertEqual(r.json["message"].count("MiB)"), 3, r.json["message"])
        self.assertEqual(g.server(self.W)["pid"], pid)
        st = g.status(self.W)
        self.assertEqual((st.rc, st.json["server"]), (0, "up"), st)
        # a dead server is not restarted while memory is short (it is restarted once it is not)
        os.kill(pid, signal.SIGKILL)
        self.assertTrue(wait_dead(pid))
        r = g.run("status", self.W, env={"BOXD_HELPER_MACHINE": "short-of-memory"})
        self.assertEqual((r.rc, r.json["error"]), (3, "GUEST_UNRESPONSIVE"), r)
        self.assertIn("not restarted", r.json["message"])
        self.assertEqual(g.server(self.W)["pid"], pid)
        r = g.run("status", self.W, env={"BOXD_HELPER_MACHINE": "overloaded"})
        self.assertEqual((r.rc, r.json["error"]), (3, "GUEST_SERVER_DOWN"), r)
        self.assertTrue(alive(g.server(self.W)["pid"]))

    def test_4_a_copied_home_never_drives_the_original_server(self):
        # boxd-local forks copy the home but not the processes: the copy's state names a live
        # server that belongs to the original; the copy must start its own
        g = self.g
        original = g.server(self.W)
        fork = Guest("fork")
        try:
            shutil.copytree(str(g.tree(self.W)), str(fork.tree(self.W)), symlinks=True)
            shutil.copytree(str(g.boxd(self.W)), str(fork.boxd(self.W)), symlinks=True)
            st = fork.status(self.W)
            self.assertEqual((st.rc, st.json["error"]), (3, "GUEST_SERVER_DOWN"), st)
            mine = fork.server(self.W)
            self.assertNotEqual(mine["pid"], original["pid"])
            self.assertNotEqual(fork.pump_pid(self.W), g.pump_pid(self.W))
            self.assertEqual(g.server(self.W)["pid"], original["pid"])
            self.assertTrue(alive(original["pid"]))
            self.assertEqual(g.status(self.W).rc, 0)
        finally:
            fork.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
