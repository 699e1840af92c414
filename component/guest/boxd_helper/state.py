"""One work on the guest: its tree, its state folder (~/.boxd-helper/works/<id>, outside the
tree), the inbox of admitted prompts and the state of its runs (state.json), which the
commands and the pump share under the state lock."""

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Optional, TypedDict

from .disk import FileLock, atomic_write, now_iso, read_json, read_text, write_json
from .procs import kill_group, owned_alive
from .protocol import LAST_TEXT_MAX, WORK_ID_MAX, WORK_RE, Fail

STATE_VERSION = 1                   # the format of state.json
SEEN_PROMPTS = 500                  # promptIds remembered for duplicate submits
RAN_KEPT = 50                       # inbox entries the pump dispatched, remembered by name
SEAL_HOLD_SECONDS = 60              # how long a seal refuses new prompts
PROMPT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
SESSION_ID_RE = re.compile(r"^ses_[A-Za-z0-9]{1,64}$")
INBOX_RE = re.compile(r"^(\d{12})-.*\.json$")


class Run(TypedDict, total=False):
    """The run in flight: the prompt OpenCode accepted, and what the pump has seen of it."""
    seq: int
    promptId: str
    sessionId: Optional[str]
    sentAt: str
    baseCount: int                  # messages in the session before this prompt
    idleTicks: int
    idleSince: Optional[float]
    retry: Optional[dict]           # OpenCode's retry entry while it waits on a provider
    activity: float                 # OpenCode's last session update, seconds
    server: dict                    # the identity of the server that accepted it


class Finished(TypedDict, total=False):
    """The last finished run, as status reports it (and one line of runs.jsonl)."""
    seq: Optional[int]
    promptId: Optional[str]
    sessionId: Optional[str]
    outcome: str                    # completed | failed | aborted
    failure: Optional[dict]         # {"kind": "auth"|"other", "message"}
    lastText: str
    interrupted: bool
    startedAt: Optional[str]
    finishedAt: str
    note: str


@dataclass
class State:
    """state.json: sequence numbers of the inbox, the run in flight, the last finished run."""
    next_seq: int = 1
    dispatched_seq: int = 0
    runs: int = 0
    current: Optional[Run] = None
    last: Optional[Finished] = None
    last_activity_at: Optional[str] = None
    interrupt_pending: bool = False
    seen: list = field(default_factory=list)
    ran: list = field(default_factory=list)     # names (without .json) of inbox entries dispatched
    forgot_at: Optional[str] = None             # when this state was made again after it was lost

    # attribute -> key in state.json
    KEYS = {"next_seq": "nextSeq", "dispatched_seq": "dispatchedSeq", "runs": "runs", "current": "current",
            "last": "last", "last_activity_at": "lastActivityAt", "interrupt_pending": "interruptPending",
            "seen": "seen", "ran": "ran", "forgot_at": "forgotAt"}

    @classmethod
    def from_json(cls, doc):
        doc = doc if isinstance(doc, dict) else {}
        return cls(**{attr: doc[key] for attr, key in cls.KEYS.items() if key in doc})

    def to_json(self):
        out = {"version": STATE_VERSION}
        out.update({key: getattr(self, attr) for attr, key in self.KEYS.items()})
        return out

    @property
    def newest_prompt(self):
        return self.seen[-1] if self.seen else None

    def remember(self, prompt_id):
        """Add a promptId to `seen` (the newest last) unless it is there."""
        if prompt_id not in self.seen:
            self.seen = (self.seen + [prompt_id])[-SEEN_PROMPTS:]

    def dispatched(self, seq, name):
        """True when the pump has handed this inbox entry to OpenCode (or given up on it):
        it is named in `ran`, or it is the run in flight or the last one. An entry whose
        sequence number is at most dispatchedSeq is not therefore sent: entries admitted by
        an older helper could share a number."""
        if name[:-len(".json")] in self.ran:
            return True
        pid = entry_id(name)
        return any(r and r.get("seq") == seq and r.get("promptId") == pid for r in (self.current, self.last))

    def mark_dispatched(self, seq, name):
        """Record that the pump handed the inbox entry `name` to OpenCode (or gave up on it)."""
        self.dispatched_seq = max(self.dispatched_seq, seq)
        key = name[:-len(".json")]
        if key not in self.ran:
            self.ran = (self.ran + [key])[-RAN_KEPT:]
        self.remember(entry_id(name))


def submit_key(prompt, files):
    """What makes two submits the same prompt on the guest: the prompt's exact text and
    each file's target and bytes, in order (`files`: [(target, sha256)])."""
    doc = [hashlib.sha256(prompt.encode("utf-8")).hexdigest(), [[t, d] for t, d in files]]
    return hashlib.sha256(json.dumps(doc, ensure_ascii=True).encode("ascii")).hexdigest()


def entry_id(name):
    """The promptId of an inbox entry's file name (<seq>-<promptId>.json)."""
    return name.split("-", 1)[1][:-len(".json")]


def cut_text(text, limit):
    """At most `limit` characters. A word the cut would split is left out whole, so the
    laptop's redaction still sees whole words (half a token may not look like one)."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    if not text[limit].isspace():
        whole = re.match(r"(?s)(.*\s)\S*$", cut)
        if whole:
            cut = whole.group(1)
    return cut.rstrip()


class Work:
    def __init__(self, work_id):
        if not isinstance(work_id, str) or not WORK_RE.fullmatch(work_id) or len(work_id) > WORK_ID_MAX:
            raise Fail("NAME_INVALID", "work id %r is not valid: use [a-z0-9-], start with a letter, end with a letter "
                                       "or digit, at most %d characters" % (work_id, WORK_ID_MAX))
        self.id = work_id
        self.home = os.path.expanduser("~")
        self.tree = os.path.join(self.home, "work", work_id)
        # Outside the tree, so the agent's `git clean -fdx` (or any cleaning of the tree)
        # cannot take the inbox, the counters or the session id with it. Same file system as
        # the tree in practice (both under $HOME): received files rename into the tree.
        self.boxd = os.path.join(self.home, ".boxd-helper", "works", work_id)
        self.legacy = os.path.join(self.tree, ".boxd")  # where helpers before this one kept it
        self.inbox = os.path.join(self.boxd, "inbox")
        self.migrate()

    def p(self, *names):
        return os.path.join(self.boxd, *names)

    def exists(self):
        return os.path.isdir(self.boxd)

    def migrate(self):
        """Move the state an older helper kept in <tree>/.boxd here, once. Under its state
        lock, so its pump (which ticks under that lock) is between steps; the pump is
        stopped first (it would go on writing to the old folder) and started again by the
        command. A rename keeps every file as it was, locks and the server's log included.
        Where it cannot be renamed (another file system) the work stays in the old folder."""
        if os.path.isdir(self.boxd) or os.path.islink(self.legacy) or not os.path.isdir(self.legacy):
            return
        try:
            os.makedirs(os.path.dirname(self.boxd), mode=0o700, exist_ok=True)
            with FileLock(os.path.join(self.legacy, "state.lock"), 30.0):
                if os.path.isdir(self.boxd):
                    return
                pump = read_json(os.path.join(self.legacy, "pump.json")) or {}
                if pump.get("pid") and owned_alive(pump, self.legacy):
                    kill_group(pump["pid"], grace=2.0)
                os.rename(self.legacy, self.boxd)
                self.link_legacy()
        except FileNotFoundError:
            return  # another command moved it meanwhile
        except TimeoutError:
            # Another command holds the old lock (it may be moving the state right now):
            # never fall back to a folder that may be gone a moment later.
            if os.path.isdir(self.boxd):
                return
            raise Fail("SESSION_BUSY", "work %s: its state is being moved out of the work tree by another command; "
                                       "call again in a moment" % self.id)
        except OSError:
            if os.path.isdir(self.boxd):
                return  # moved by another command after all
            self.boxd, self.inbox = self.legacy, os.path.join(self.legacy, "inbox")

    def link_legacy(self):
        """<tree>/.boxd as a symlink to the state, best effort: an older helper (a host of
        an earlier version sharing the ledger uploads its own) then finds the same state
        instead of starting a second one beside it. The agent's git clean may remove the
        link; the state it points to stays, and prepare makes the link again."""
        if self.boxd == self.legacy or os.path.lexists(self.legacy) or not os.path.isdir(self.tree):
            return
        try:
            os.symlink(self.boxd, self.legacy)
        except OSError:
            pass

    def require(self):
        if self.exists():
            return
        if os.path.isdir(self.tree):
            # Prepared once (the tree is here), and its state removed since: not a work the
            # machine never had, and not to be answered as if nothing was lost.
            raise Fail("GUEST_STATE_LOST", "the guest helper's state of work %s (%s) is gone, though its work tree is "
                                           "there; the transcript is still in the guest's OpenCode. Prompts that "
                                           "were waiting to start went with it and will not run" % (self.id, self.boxd))
        raise Fail("WORK_UNKNOWN", "work %s was never prepared on this machine (%s is missing)" % (self.id, self.tree))

    def create(self):
        try:
            os.makedirs(self.tree, exist_ok=True)
            os.makedirs(os.path.dirname(self.boxd), mode=0o700, exist_ok=True)
            os.makedirs(self.inbox, exist_ok=True)
            os.makedirs(self.p("tmp"), exist_ok=True)
            os.chmod(self.boxd, 0o700)
            self.link_legacy()
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
        return State.from_json(read_json(self.p("state.json"), None))

    def save_state(self, st):
        write_json(self.p("state.json"), st.to_json())

    def inbox_entries(self):
        """[(seq, filename)] oldest first."""
        out = []
        try:
            names = os.listdir(self.inbox)
        except FileNotFoundError:
            return out
        for n in names:
            m = INBOX_RE.match(n)
            if m:
                out.append((int(m.group(1)), n))
        out.sort()
        return out

    def waiting(self, st):
        """The inbox entries OpenCode has not accepted yet."""
        return [e for e in self.inbox_entries() if not st.dispatched(*e)]

    def admitted(self, st, entries=None):
        """Every promptId this work has admitted that it still remembers: those in `seen`,
        those in the inbox (an admission killed before its state write left only its entry),
        the run in flight and the last one."""
        ids = set(st.seen)
        ids.update(entry_id(name) for _, name in (self.inbox_entries() if entries is None else entries))
        ids.update(r["promptId"] for r in (st.current, st.last) if r and isinstance(r.get("promptId"), str))
        return ids

    def pending_twin(self, st, entries, key):
        """The promptId of an admitted prompt with submit key `key` that has not ended: the
        run in flight, or one waiting in the inbox. None when there is none (entries an
        older helper admitted carry no key, and match nothing)."""
        if not key:
            return None
        cur = st.current or {}
        if cur.get("key") == key and isinstance(cur.get("promptId"), str):
            return cur["promptId"]
        for seq, name in entries:
            if st.dispatched(seq, name):
                continue
            item = read_json(os.path.join(self.inbox, name))
            if isinstance(item, dict) and item.get("key") == key:
                return entry_id(name)
        return None

    def admission_seq(self, st, entries):
        """The sequence number of the next admission: past every number state.json knows
        and past every entry in the inbox, so no two entries ever share one."""
        return max([st.next_seq, st.dispatched_seq + 1] + [seq + 1 for seq, _ in entries])

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

    # -- runs
    def finish_run(self, st, outcome, failure, text, interrupted=False, note=None):
        cur = st.current or {}
        ts = time.time()
        st.last = {
            "seq": cur.get("seq"), "promptId": cur.get("promptId"), "sessionId": cur.get("sessionId"),
            "outcome": outcome, "failure": failure, "lastText": cut_text(text or "", LAST_TEXT_MAX),
            "interrupted": bool(interrupted), "startedAt": cur.get("sentAt"), "finishedAt": now_iso(ts),
        }
        if note:
            st.last["note"] = note
        if cur.get("declined"):
            st.last["declined"] = cur["declined"]
        st.current = None
        st.last_activity_at = now_iso(ts)
        try:
            with open(self.p("runs.jsonl"), "a", encoding="utf-8") as f:
                f.write(json.dumps(st.last, ensure_ascii=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            pass

    def resolved(self, ids):
        """{promptId: admitted?} for the ids the laptop asks about: those it never heard back
        about, and (export) the newest since its last proof."""
        if not ids:
            return {}
        if not self.exists():
            return {i: False for i in ids if isinstance(i, str) and PROMPT_ID_RE.match(i)}
        # The inbox first, then the state: the pump records an entry it dispatched in the
        # state before it removes the entry, so a prompt is found in one or the other.
        entries = self.inbox_entries()
        known = self.admitted(self.state(), entries)
        return {i: i in known for i in ids if isinstance(i, str) and PROMPT_ID_RE.match(i)}

    def sealed_recently(self):
        """A seal younger than SEAL_HOLD_SECONDS: a drop may be removing this machine."""
        try:
            age = time.time() - os.stat(self.p("sealed")).st_mtime
        except FileNotFoundError:
            return False
        if 0 <= age < SEAL_HOLD_SECONDS:
            return True
        try:
            os.unlink(self.p("sealed"))
        except OSError:
            pass
        return False
