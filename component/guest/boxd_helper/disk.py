"""Files that survive a frozen machine, a killed pump or a power cut: temp file + fsync +
rename for every state file, JSON reads that treat a damaged file as absent, and flock(2)
locks that die with their holder."""

import errno
import fcntl
import hashlib
import json
import os
import tempfile
import time
from datetime import datetime, timezone


def now_iso(ts=None):
    ts = time.time() if ts is None else ts
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % int((ts % 1) * 1000)


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()


def file_sha256(path):
    """The sha256 of the file at `path`, read in 1 MiB chunks (OSError as open and read raise it)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
