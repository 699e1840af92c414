"""The protocol with the laptop: limits, the work-id rule and the error kinds come from
protocol.json (beside this package, at the root of the zipapp), the one file the component
checks its own constants against. Also the way every command answers: one JSON object."""

import errno
import json
import os
import re
import sys

EXIT_OK, EXIT_USAGE, EXIT_DOMAIN, EXIT_CRASH = 0, 2, 3, 70

# The zipapp (or the folder it is built from): what `python3 <ENTRY> <command>` runs.
ENTRY = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load():
    # The package's own loader reads the file from the zip or from the folder alike; the
    # path must start as the loader's own does (unresolved), or a zip will not find it.
    raw = __loader__.get_data(os.path.join(os.path.dirname(os.path.dirname(__file__)), "protocol.json"))
    doc = json.loads(raw.decode("utf-8"))
    units = {name: limit["unit"] for name, limit in doc["limits"].items()}
    want = {"prompt": "bytes", "file": "bytes", "call": "bytes", "listing": "entries", "lastText": "characters"}
    if units != want:
        raise ValueError("protocol.json limits are %r; this helper understands %r" % (units, want))
    return doc


PROTOCOL = _load()
_LIMITS = {name: limit["max"] for name, limit in PROTOCOL["limits"].items()}
PROMPT_MAX = _LIMITS["prompt"]
FILE_MAX = _LIMITS["file"]              # per file, both directions
CALL_MAX = _LIMITS["call"]              # per call, both directions
LIST_MAX = _LIMITS["listing"]           # entries per git listing
LAST_TEXT_MAX = _LIMITS["lastText"]     # characters kept in lastText
WORK_ID_MAX = PROTOCOL["workId"]["maxLength"]
WORK_RE = re.compile(PROTOCOL["workId"]["pattern"])
KINDS = frozenset(PROTOCOL["errorKinds"])


def mib(n):
    return "%d MiB" % (n >> 20)


def known_kind(kind):
    """Only the kinds protocol.json lists may leave the helper: the laptop maps them to its
    codes. Any other is a bug here, and crashes loudly instead of reaching the laptop."""
    if kind not in KINDS:
        raise ValueError("error kind %r is not in protocol.json" % (kind,))
    return kind


class Fail(Exception):
    """A domain failure: exit 3 with {"ok": false, "error": kind, "message": ...}."""

    def __init__(self, kind, message, **extra):
        super().__init__(message)
        self.kind = known_kind(kind)
        self.message = message
        self.extra = extra


def disk_full(e):
    """True for an OSError that says the guest's disk (or the user's quota) is full."""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def workspace_failure(e, doing):
    """The GUEST_WORKSPACE failure for an OSError met while `doing` something in the work."""
    if disk_full(e):
        return Fail("GUEST_WORKSPACE", "the guest's disk is full (%s while %s): free space on the machine, "
                                       "then try again" % (e.strerror or e, doing))
    return Fail("GUEST_WORKSPACE", "%s failed: %s" % (doing, e.strerror or e))


class Usage(Exception):
    """A malformed command line: exit 2, kind ARGS_INVALID."""


def emit(obj, code):
    """Print the one answer: one line of ASCII JSON on stdout (non-ASCII escaped, so a lossy
    decoder on the way cannot damage it). Returns the exit code to use."""
    data = json.dumps(obj, ensure_ascii=True, separators=(",", ":")) + "\n"
    out = sys.stdout.buffer
    out.write(data.encode("ascii"))
    out.flush()
    return code


def failure(kind, message, extra=None):
    """The answer of a failed command: the three fixed fields, then those of `extra`."""
    obj = {"ok": False, "error": known_kind(kind), "message": message}
    for k, v in (extra or {}).items():
        obj.setdefault(k, v)
    return obj
