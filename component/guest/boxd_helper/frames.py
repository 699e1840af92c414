"""Frames: how file bytes cross the laptop-guest line without JSON or base64. After the
one JSON line (on stdin for submit, on stdout for git) come the files, in the order the
JSON lists them, each as `<size>\\n<size bytes><sha256 hex>\\n` (docs/guest.md, "Frames").
The sender computes the digest while it streams; the receiver computes it again."""

import hashlib
import os

from .protocol import FILE_MAX, Fail, mib

CHUNK = 1 << 20
# A size header is at most this many digits: FILE_MAX has fewer.
HEADER_MAX = 20


def read_header(stream, what):
    line = stream.readline(HEADER_MAX + 1)
    if not line.endswith(b"\n") or not line[:-1].isdigit():
        raise Fail("ARGS_INVALID", "%s: expected a frame header (<size>\\n), got %r" % (what, line[:HEADER_MAX]))
    size = int(line[:-1])
    if size > FILE_MAX:
        raise Fail("FILE_TOO_LARGE", "%s is %d bytes; the limit is %s per file" % (what, size, mib(FILE_MAX)), path=what)
    return size


def copy_frame(stream, fd, what):
    """Copy one frame's bytes from `stream` to the file descriptor `fd`, checking the
    sender's digest; returns (size, sha256 hex)."""
    size = read_header(stream, what)
    digest, left = hashlib.sha256(), size
    while left:
        chunk = stream.read(min(CHUNK, left))
        if not chunk:
            raise Fail("ARGS_INVALID", "%s: the frame ended after %d of %d bytes" % (what, size - left, size), path=what)
        digest.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view):]
        left -= len(chunk)
    sha = digest.hexdigest()
    trailer = stream.read(65)
    if trailer != sha.encode("ascii") + b"\n":
        raise Fail("ARGS_INVALID", "%s arrived damaged: its digest is %s, the sender's %r" % (what, sha, trailer[:64]), path=what)
    return size, sha


def send_frame(out, fd, size):
    """Write the first `size` bytes of the open file `fd` to `out` as one frame. A file
    that shrank meanwhile raises OSError: the frame cannot be finished."""
    out.write(b"%d\n" % size)
    digest, left = hashlib.sha256(), size
    while left:
        chunk = os.read(fd, min(CHUNK, left))
        if not chunk:
            raise OSError("the file shrank while it was sent")
        digest.update(chunk)
        out.write(chunk)
        left -= len(chunk)
    out.write(digest.hexdigest().encode("ascii") + b"\n")
