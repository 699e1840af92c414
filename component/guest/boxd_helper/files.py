"""Files crossing the laptop-guest line: paths the laptop names are relative, inside the
tree, never under .boxd/ and never through a symlink; sizes stay within the protocol's
limits; a submit's files are all checked and received before any is written. Their
bytes travel as frames (frames.py), never in the JSON."""

import errno
import os
import tempfile
import time

from .disk import file_sha256, read_json, write_json
from .frames import copy_frame, send_frame
from .gitstate import git
from .protocol import CALL_MAX, FILE_MAX, Fail, mib, workspace_failure

NAME_MAX = 255                      # bytes in one path component (Linux)
PATH_MAX = 4096                     # bytes in a path, its terminating NUL included (Linux)
TEMP_MAX_AGE = 3600                 # seconds: a receive temp older than this was left by a killed helper


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


def too_long(parts):
    """The first component longer than a file name may be, or None."""
    return next((c for c in parts if len(c.encode("utf-8")) > NAME_MAX), None)


def check_target(work, parts, kind):
    """Refuse symlinks and non-directories on the way to tree/parts; returns the absolute path."""
    cur = work.tree
    for i, comp in enumerate(parts):
        cur = os.path.join(cur, comp)
        try:
            os.lstat(cur)
        except FileNotFoundError:
            return cur if i == len(parts) - 1 else os.path.join(cur, *parts[i + 1:])
        except OSError as e:
            if e.errno == errno.ENAMETOOLONG:  # no such file can exist
                raise Fail("NAME_INVALID", "%s is too long a path for the guest's file system" % "/".join(parts), path="/".join(parts))
            raise
        if os.path.islink(cur):
            raise Fail(kind, "%s is a symlink; refusing %s" % ("/".join(parts[:i + 1]), "/".join(parts)), path="/".join(parts))
        last = i == len(parts) - 1
        if not last and not os.path.isdir(cur):
            raise Fail(kind, "%s is not a folder; refusing %s" % ("/".join(parts[:i + 1]), "/".join(parts)), path="/".join(parts))
        if last and os.path.isdir(cur):
            raise Fail(kind, "%s is a folder" % "/".join(parts), path="/".join(parts))
    return cur


def read_requested(work, requested):
    """Check the files the laptop asked for: [{path, size, mode}] for the answer, in the
    order asked. Their bytes follow the answer as frames (send_requested)."""
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
            os.close(os.open(full, os.O_RDONLY | os.O_NOFOLLOW))
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Fail("PATH_REFUSED", "%s is a symlink" % rel, path=rel)
            raise Fail("GUEST_WORKSPACE", "cannot read %s: %s" % (rel, e.strerror or e), path=rel)
        files.append({"path": "/".join(parts), "size": st.st_size, "mode": st.st_mode & 0o777})
    return files


def send_requested(work, files, out):
    """After the answer: each file of read_requested as one frame, read once. The answer
    is out already, so a file that changed meanwhile (now a symlink, past the limits,
    shrunk) raises: the laptop sees the frames end early and keeps the file owed."""
    total = 0
    for f in files:
        parts = f["path"].split("/")
        full = check_target(work, parts, "PATH_REFUSED")
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            size = os.fstat(fd).st_size
            total += size
            if size > FILE_MAX or total > CALL_MAX:
                raise OSError("%s grew past the limits while being sent" % f["path"])
            send_frame(out, fd, size)
        finally:
            os.close(fd)
    out.flush()


def plan_files(work, files):
    """Check every file of a submit before any is received: [(parts, target)]."""
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
        long_name = too_long(parts)
        if long_name is not None:
            raise Fail("NAME_INVALID", "files[%d].to has a name of %d bytes; a file or folder name may have at most %d"
                       % (i, len(long_name.encode("utf-8")), NAME_MAX), path=rel)
        key = "/".join(parts)
        if len(os.path.join(work.tree, key).encode("utf-8")) >= PATH_MAX:
            raise Fail("NAME_INVALID", "files[%d].to is too long a path: the work tree and it may have at most %d bytes"
                       % (i, PATH_MAX - 1), path=rel)
        if key in seen_paths:
            raise Fail("NAME_INVALID", "%s is listed twice" % key, path=rel)
        seen_paths.add(key)
        target = check_target(work, parts, "NAME_INVALID")
        planned.append((parts, target))
    # One target may not be a folder on the way to another: placing both would replace the
    # first and then fail on the second, with the work tree half written.
    for parts, _ in planned:
        for j in range(1, len(parts)):
            folder = "/".join(parts[:j])
            if folder in seen_paths:
                raise Fail("NAME_INVALID", "%s is both a file of this submit and a folder on the way to %s"
                           % (folder, "/".join(parts)), path=folder)
    return planned


def receive_files(work, planned, stream, digests=None):
    """Read one frame per planned file from `stream` into a temp file of the work's own
    (digest checked): [(parts, target, temp)]. On any failure none is kept. `digests`, when
    given, gets each file's sha256 in order."""
    received, total = [], 0
    try:
        for parts, target in planned:
            try:
                fd, temp = tempfile.mkstemp(prefix="in-", suffix=".boxd-tmp", dir=work.p("tmp"))
                received.append((parts, target, temp))
                try:
                    size, sha = copy_frame(stream, fd, "/".join(parts))
                finally:
                    os.close(fd)
            except OSError as e:
                raise workspace_failure(e, "receiving %s" % "/".join(parts))
            if digests is not None:
                digests.append(sha)
            total += size
            if total > CALL_MAX:
                raise Fail("FILE_TOO_LARGE", "the files add up to more than %s" % mib(CALL_MAX), path="/".join(parts))
    except BaseException:
        discard(received)
        raise
    return received


def sweep_temps(work, max_age=TEMP_MAX_AGE):
    """Remove receive temps (.boxd/tmp/in-*) older than `max_age` seconds: a helper killed
    while it received a submit's files (up to 32 MiB) left them. A live submit's are new."""
    folder, now = work.p("tmp"), time.time()
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if not (name.startswith("in-") and name.endswith(".boxd-tmp")):
            continue
        path = os.path.join(folder, name)
        try:
            if now - os.lstat(path).st_mtime > max_age:
                os.unlink(path)
        except OSError:
            pass


def discard(received):
    for _, _, temp in received:
        try:
            os.unlink(temp)
        except OSError:
            pass


# The digests a path was given by submits, newest last, at most this many a path: bytes
# that came from the laptop, which a later submit may replace even when the laptop never
# heard that they landed (a submit whose answer was lost).
PLACED_KEPT = 16


def placed(work):
    """{path: [sha256, ...]} the submits placed (placed.json in the work's folder)."""
    got = read_json(work.p("placed.json"), {})
    return got if isinstance(got, dict) else {}


def remember_placed(work, entries):
    """Add (path, sha256) pairs to placed.json. Best effort: one not written only makes a
    later submit to that path refuse (FILE_CONFLICT), which loses nothing."""
    known = placed(work)
    for key, sha in entries:
        kept = [d for d in known.get(key, []) if isinstance(d, str) and d != sha] + [sha]
        known[key] = kept[-PLACED_KEPT:]
    try:
        write_json(work.p("placed.json"), known, 0o600)
    except OSError:
        pass


def unheld(work, received, keep):
    """The targets whose file the submit would replace with bytes the laptop does not hold:
    not one of `keep[path]` (what the laptop sent or brought home there, and what is sent
    now), nor what the tree's last commit holds there. The agent's output that no harvest
    brought home was replaced, and the drop then took the only copy with the machine."""
    out = []
    for parts, target, _ in received:
        key = "/".join(parts)
        if os.path.islink(target) or not os.path.isfile(target):
            continue
        try:
            if os.path.getsize(target) > FILE_MAX:
                # No file past the cap ever crossed the line, so the laptop holds none:
                # not read through (an agent's 10 GB file would outlast the helper's bound).
                out.append(key)
                continue
            sha = file_sha256(target)
        except OSError:
            out.append(key)  # unreadable: not known to be held
            continue
        if sha in keep.get(key, ()) or committed(work, key, target):
            continue
        out.append(key)
    return out


def committed(work, key, target):
    """Whether the file at `target` is byte for byte what HEAD holds at `key`, and the index
    holds the same there: a version staged apart (`git add`, then the file put back) is in
    no commit and no patch, and would go with the replaced file's last trace. Compared raw;
    as git reads it (a CRLF file git status calls clean) only where no filter attribute
    applies, since a clean filter (nbstripout, LFS) drops bytes that no commit then holds."""
    head = git(work, ["rev-parse", "-q", "--verify", "HEAD:" + key], check=False)
    staged = git(work, ["rev-parse", "-q", "--verify", ":0:" + key], check=False)
    if head.returncode != 0 or staged.returncode != 0 or staged.stdout.strip() != head.stdout.strip():
        return False
    blob = head.stdout.strip()
    raw = git(work, ["hash-object", "--no-filters", "--", target], check=False)
    if raw.returncode == 0 and raw.stdout.strip() == blob:
        return True
    attr = git(work, ["check-attr", "filter", "--", key], check=False)
    if attr.returncode != 0 or not attr.stdout.strip().endswith(b": unspecified"):
        return False
    read = git(work, ["hash-object", "--", target], check=False)
    return read.returncode == 0 and read.stdout.strip() == blob


def write_files(work, received, keep):
    """Move received files into place (a rename each), parents created, an existing
    file's mode kept; the way is checked again, since the agent may have changed the tree
    meanwhile. A target holding bytes the laptop does not hold is refused (`unheld`), the
    whole submit with it. Then one sync(2) makes them all durable before the prompt is
    admitted: a flush per file costs ten times as much for many small files."""
    tree_real = os.path.realpath(work.tree)
    try:
        # every target is checked before anything is placed (the agent may have changed the
        # tree since plan_files), then each again right before its own rename
        for parts, _, _ in received:
            check_target(work, parts, "NAME_INVALID")
        lost = unheld(work, received, keep)
        if lost:
            raise Fail("FILE_CONFLICT", "the work tree's %s holds bytes this laptop does not have (written on the "
                       "machine since the last harvest); a submit would replace them, so nothing was written or "
                       "admitted" % ", ".join(lost), path=lost[0], paths=lost)
        for placed_so_far, (parts, target, temp) in enumerate(received):
            parent = os.path.dirname(target)
            check_target(work, parts, "NAME_INVALID")
            # Once more right before its rename: the agent may be writing it now (a submit
            # is admitted while a run goes on), and the check above hashed other files since.
            changed = unheld(work, [(parts, target, temp)], keep)
            if changed:
                raise Fail("FILE_CONFLICT", "the work tree's %s changed on the machine while this submit placed its files, "
                           "to bytes this laptop does not have; it was not replaced, %d file(s) before it were, and the "
                           "prompt was not admitted" % (changed[0], placed_so_far), path=changed[0], paths=changed)
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
            os.chmod(temp, mode)
            os.replace(temp, target)
        if received:
            os.sync()
    except OSError as e:
        raise workspace_failure(e, "writing into the work tree")
    finally:
        discard(received)  # those not moved: a failure part way
