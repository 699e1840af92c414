"""The work's OpenCode: where its executable is, the environment it runs with, and HTTP to
its server."""

import base64
import errno
import http.client
import json
import os
import shutil
import socket
import subprocess

from .disk import atomic_write, read_json
from .protocol import Fail

USERNAME = "opencode"


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


# What `opencode --version` said, per binary: asking costs a second or more (the binary
# starts a runtime), and prepare runs on every ensure and resume. Keyed by what changes when
# the binary is replaced or updated in place (real path, inode, size, mtime, ctime).
VERSION_CACHE = os.path.join("~", ".boxd-helper", "opencode-version.json")


def _binary_key(binary):
    real = os.path.realpath(binary)
    st = os.stat(real)
    return [real, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def opencode_version(binary):
    try:
        key = _binary_key(binary)
    except OSError:
        key = None
    cache = os.path.expanduser(VERSION_CACHE)
    try:
        seen = read_json(cache) if key else None
    except OSError:
        seen = None
    if isinstance(seen, dict) and seen.get("key") == key and isinstance(seen.get("version"), str):
        return seen["version"]
    version = _ask_version(binary)
    if key:
        try:
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            atomic_write(cache, json.dumps({"key": key, "version": version}).encode("utf-8"), durable=False)
        except OSError:
            pass  # a cache that cannot be written only costs the next prepare the same ask
    return version


def _ask_version(binary):
    try:
        r = subprocess.run([binary, "--version"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=60, env=opencode_env())
    except subprocess.TimeoutExpired:
        # Not an answer about the OpenCode, so not GUEST_VERSION: the laptop removes a
        # rebuild on GUEST_VERSION, and a busy machine's next ask may well succeed.
        raise Fail("GUEST_FAILED", "%s --version did not answer within 60 s" % binary)
    except OSError as e:
        # Missing or not runnable is final for the image; a fork that failed for want of
        # memory or processes, or a binary being replaced (ETXTBSY), is the machine's moment.
        if e.errno in (errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR):
            raise Fail("GUEST_VERSION", "cannot run %s --version: %s" % (binary, e))
        raise Fail("GUEST_FAILED", "cannot run %s --version: %s" % (binary, e))
    text = r.stdout.decode("utf-8", "replace").strip()
    if r.returncode < 0:
        raise Fail("GUEST_FAILED", "%s --version was killed by signal %d (a busy machine?)" % (binary, -r.returncode))
    if r.returncode != 0 or not text:
        raise Fail("GUEST_VERSION", "%s --version failed (exit %d): %s" % (binary, r.returncode,
                                                                             r.stderr.decode("utf-8", "replace")[-300:]))
    return text.splitlines()[-1].strip()
