"""The work tree as git sees it, for harvest and drop: HEAD, refs, status, the patch
against HEAD, every untracked and ignored file with its digest, and a verified bundle of
every commit. .boxd/ never appears in any of it."""

import base64
import shutil
import os
import subprocess
import tempfile

from .disk import file_sha256, sha256_hex
from .protocol import CALL_MAX, LIST_MAX, Fail, mib

GIT_IDENTITY = ("opencode-boxd", "opencode-boxd@localhost")


def git(work, argv, check=True, timeout=120, index=None, stdin=None, tree=None):
    """git in the work tree (or `tree`); `index`: a private index file to use instead."""
    env = dict(os.environ)
    for k in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR", "GIT_PREFIX"):
        env.pop(k, None)
    env.update({"GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "PAGER": "cat"})
    if index:
        env["GIT_INDEX_FILE"] = index
    where = tree or work.tree
    cmd = ["git", "-C", where, "-c", "core.quotePath=false", "-c", "color.ui=false",
           "-c", "safe.directory=" + where, "-c", "core.fsmonitor=false"] + argv
    try:
        r = subprocess.run(cmd, input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=timeout)
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
    try:
        sha = file_sha256(full)
    except OSError as e:
        entry.update({"unreadable": e.strerror or str(e), "sha256": None, "size": st.st_size})
        return entry
    entry.update({"size": st.st_size, "sha256": sha})
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
    keep_stashes(work)
    refs = {}
    if out["head"]:
        refs["HEAD"] = out["head"]
    for line in git(work, ["for-each-ref", "--format=%(objectname) %(refname)"]).stdout.decode("utf-8", "replace").splitlines():
        sha, _, name = line.partition(" ")
        if sha and name:
            refs[name] = sha
    out["refs"] = refs
    with unflagged_index(work) as index:
        return inventory_with(work, out, index)


def staged_apart(work, index):
    """The paths whose staged version differs from both HEAD and the file (read with -z: real
    names, a rename's new one), leaving out those whose staged bytes are the file's (a
    mode changed after `git add`: the patch carries it). At most 200."""
    st = git(work, ["status", "--porcelain=v1", "-z", "--untracked-files=no"], index=index).stdout.split(b"\0")
    apart, i = [], 0
    while i < len(st) and len(apart) < 200:
        rec = st[i]
        i += 1
        if len(rec) < 4:
            continue
        x, y, path = chr(rec[0]), chr(rec[1]), rec[3:].decode("utf-8", "replace")
        if x in "RC" or y in "RC":
            i += 1  # the rename's old name follows (in either column: `git add -N` marks one in the tree's)
        if x in " ?!" or y in " ?!" or is_boxd_path(path):
            continue
        try:
            # `:0:` names stage 0 whatever the path looks like (a file named `1:t`).
            staged = git(work, ["rev-parse", "-q", "--verify", ":0:" + path], check=False, index=index)
            here = git(work, ["hash-object", "--", path], check=False)
        except Fail:  # a clean filter that hangs: named, not a failed inventory
            staged = here = None
        if staged and here and staged.returncode == 0 and here.returncode == 0 and staged.stdout.strip() == here.stdout.strip():
            continue
        apart.append(path)
    return apart


def inventory_with(work, out, index):
    """The rest of `inventory`, reading the tree through `index` (None: git's own)."""
    st = git(work, ["status", "--porcelain=v1", "--untracked-files=all"], index=index)
    lines = []
    for line in st.stdout.decode("utf-8", "replace").splitlines():
        paths = line[3:].split(" -> ")
        if any(is_boxd_path(p.strip('"')) for p in paths):
            continue
        lines.append(line)
    out["status"] = lines
    out["dirty"] = any(not line.startswith("??") for line in lines)
    out["changed"] = [line[3:] for line in lines if not line.startswith("??")][:200]
    # Staged, then changed again in the tree (`MM`, `AM`, `MD`, a conflict's `UU`…): the index
    # may hold a version that is in no commit and not in the tree, so not in the patch
    # (`git diff HEAD`) either.
    out["stagedApart"] = staged_apart(work, index) if any(l[0] not in " ?!" and l[1] not in " ?!" for l in lines) else []
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
                          "--src-prefix=a/", "--dst-prefix=b/", "--", ".", ":(exclude).boxd"], index=index).stdout
    out["worktrees"] = dirty_worktrees(work)
    return out, diff


def keep_stashes(work):
    """Every stash entry as a ref of our own (refs/boxd-stash/<sha>): `git bundle --all`
    takes refs/stash, the newest entry only, and the older ones live only in its reflog,
    so a drop would destroy them. As refs they travel in the bundle and the drop checks them.
    So do the HEADs of linked work trees on a detached HEAD (refs/boxd-worktree/<sha>),
    which no ref names either. A ref that can not be made is GUEST_FAILED: silently missing,
    it would let a drop destroy that entry. Ours whose commit no longer needs one (a stash
    dropped since) are removed."""
    wanted = {"refs/boxd-stash/" + sha: sha for sha in hex_lines(git(work, ["stash", "list", "--format=%H"]).stdout)}
    for head in detached_worktree_heads(work):
        wanted["refs/boxd-worktree/" + head] = head
    ours = git(work, ["for-each-ref", "--format=%(refname)", "refs/boxd-stash/", "refs/boxd-worktree/"]).stdout
    for name in ours.decode("utf-8", "replace").split():
        if name not in wanted:
            git(work, ["update-ref", "-d", name])
    for name, sha in wanted.items():
        git(work, ["update-ref", name, sha])


def hex_lines(out):
    return [l for l in out.decode("ascii", "replace").split() if len(l) in (40, 64) and all(c in "0123456789abcdef" for c in l)]


def linked_worktrees(work):
    """[(path bytes, detached HEAD sha or None)] of every linked work tree (not the main one)."""
    r = git(work, ["worktree", "list", "--porcelain", "-z"], check=False)
    trees, cur = [], None
    for field in r.stdout.split(b"\0"):
        if field.startswith(b"worktree "):
            cur = {"path": field[len(b"worktree "):], "head": None, "detached": False}
            trees.append(cur)
        elif cur is not None and field.startswith(b"HEAD "):
            cur["head"] = field[len(b"HEAD "):].decode("ascii", "replace")
        elif cur is not None and field == b"detached":
            cur["detached"] = True
    main = os.path.realpath(os.fsencode(work.tree))
    return [(t["path"], t["head"] if t["detached"] else None) for t in trees[1:] if os.path.realpath(t["path"]) != main]


def detached_worktree_heads(work):
    return [head for _, head in linked_worktrees(work) if head and hex_lines(head.encode())]


class unflagged_index:
    """A private copy of the index without the assume-unchanged and skip-worktree flags of
    files that exist: those flags make status and diff skip a file, so an edit to it would
    be in no patch and a drop would destroy it. The repository's own index is not changed.
    `tree`: a linked work tree of the work's repository (its own index), else the work's."""

    def __init__(self, work, tree=None):
        self.work, self.tree, self.dir, self.path = work, tree or work.tree, None, None

    def __enter__(self):
        try:
            return self.make()
        except BaseException:
            self.__exit__()
            raise

    def make(self):
        flagged = []
        for rec in git(self.work, ["ls-files", "-v", "-z"], tree=self.tree).stdout.split(b"\0"):
            tag, path = rec[:1], rec[2:]
            if path and (tag.islower() or tag == b"S") and os.path.lexists(os.path.join(os.fsencode(self.tree), path)):
                flagged.append(path)
        if not flagged:
            return None
        real = git(self.work, ["rev-parse", "--git-path", "index"], tree=self.tree).stdout.decode("utf-8", "replace").strip()
        self.dir = tempfile.mkdtemp(prefix="boxd-index-")
        self.path = os.path.join(self.dir, "index")
        shutil.copyfile(os.path.join(self.tree, real), self.path)
        # One flag per call: given both, update-index applies only the last to --stdin paths.
        for flag in ("--no-assume-unchanged", "--no-skip-worktree"):
            git(self.work, ["update-index", flag, "-z", "--stdin"], index=self.path, stdin=b"\0".join(flagged) + b"\0", tree=self.tree)
        return self.path

    def __exit__(self, *exc):
        # (also called by __enter__ when making the copy failed)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        return False


def dirty_worktrees(work):
    """Linked work trees (`git worktree add`) with uncommitted changes: their branches are
    refs of this repository and travel in the bundle (a detached HEAD as a ref of ours,
    `keep_stashes`), their uncommitted files do not. Each is read without its index's
    assume-unchanged and skip-worktree flags, as the work tree is. One that cannot be read
    counts as dirty."""
    dirty = []
    for path, _ in linked_worktrees(work):
        if not os.path.isdir(path):
            continue  # gone (prunable): nothing is left in it
        tree = os.fsdecode(path)
        try:
            with unflagged_index(work, tree) as index:
                st = git(work, ["status", "--porcelain=v1", "--untracked-files=all"], check=False, tree=tree, index=index)
        except Fail:
            dirty.append(tree)
            continue
        if st.returncode != 0 or st.stdout.strip():
            dirty.append(tree)
    return sorted(dirty)


def make_bundle(work):
    """Every commit on the machine (all refs and HEAD) as one self-contained bundle,
    verified here before it travels: {"data": base64, "sha256", "size"}."""
    with tempfile.TemporaryDirectory(prefix="boxd-bundle-") as tmp:
        path = os.path.join(tmp, "harvest.bundle")
        git(work, ["bundle", "create", "-q", path, "HEAD", "--all", "--"])  # "--": a file named HEAD is no revision
        git(work, ["bundle", "verify", "-q", path])
        with open(path, "rb") as f:
            data = f.read()
    if len(data) > CALL_MAX:
        raise Fail("FILE_TOO_LARGE", "the work's commits make a %d-byte bundle; the limit is %s per call" % (len(data), mib(CALL_MAX)))
    return {"data": base64.b64encode(data).decode("ascii"), "sha256": sha256_hex(data), "size": len(data)}


def ensure_git_exclude(work):
    """Make git ignore .boxd whenever the tree is (now) a repository: "/.boxd", which also
    matches the symlink an older helper's folder became (".boxd/" matches folders only)."""
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
        if any(line.strip() in (".boxd", "/.boxd") for line in current.splitlines()):
            return
        os.makedirs(os.path.dirname(exclude), exist_ok=True)
        with open(exclude, "a", encoding="utf-8") as f:
            if current and not current.endswith("\n"):
                f.write("\n")
            f.write("/.boxd\n")
    except OSError:
        pass



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
