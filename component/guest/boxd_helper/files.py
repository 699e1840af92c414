"""Files crossing the laptop-guest line: paths the laptop names are relative, inside the
tree, never under .boxd/ and never through a symlink; sizes stay within the protocol's
limits; a submit's files are all checked before any is written."""

import base64
import errno
import os

from .disk import atomic_write, sha256_hex
from .protocol import CALL_MAX, FILE_MAX, Fail, mib


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
            raise Fail("FILE_TOO_LARGE", "%s is %d bytes; the limit is %s per file" % (rel, st.st_size, mib(FILE_MAX)), path=rel)
        total += st.st_size
        if total > CALL_MAX:
            raise Fail("FILE_TOO_LARGE", "the requested files add up to more than %s" % mib(CALL_MAX), path=rel)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                data = f.read(FILE_MAX + 1)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Fail("PATH_REFUSED", "%s is a symlink" % rel, path=rel)
            raise Fail("GUEST_WORKSPACE", "cannot read %s: %s" % (rel, e.strerror or e), path=rel)
        if len(data) > FILE_MAX:
            raise Fail("FILE_TOO_LARGE", "%s grew past %s while being read" % (rel, mib(FILE_MAX)), path=rel)
        files.append({"path": "/".join(parts), "size": len(data), "sha256": sha256_hex(data),
                      "mode": st.st_mode & 0o777, "data": base64.b64encode(data).decode("ascii")})
    return files


def plan_files(work, files):
    """Check every file of a submit before any is written: [(parts, target, data)]."""
    if not isinstance(files, list):
        raise Fail("ARGS_INVALID", "files must be a list")
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
            raise Fail("FILE_TOO_LARGE", "%s is %d bytes; the limit is %s per file" % (rel, len(data), mib(FILE_MAX)), path=rel)
        total += len(data)
        if total > CALL_MAX:
            raise Fail("FILE_TOO_LARGE", "the files add up to more than %s" % mib(CALL_MAX), path=rel)
        want = f.get("sha256")
        if want is not None and (not isinstance(want, str) or want.lower() != sha256_hex(data)):
            raise Fail("ARGS_INVALID", "%s: sha256 %s does not match the data (%s)" % (rel, want, sha256_hex(data)), path=rel)
        key = "/".join(parts)
        if key in seen_paths:
            raise Fail("NAME_INVALID", "%s is listed twice" % key, path=rel)
        seen_paths.add(key)
        target = check_target(work, parts, "NAME_INVALID")
        planned.append((parts, target, data))
    return planned


def write_files(work, planned):
    """Write planned files atomically, parents created, an existing file's mode kept; the
    way is checked again, since the agent may have changed the tree meanwhile."""
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
