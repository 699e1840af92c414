"""The inbox and a submit's files, in process against a fake OpenCode: every admitted prompt
runs once and is reported as reached, whatever was killed where; a refused submit writes
nothing; the failures a guest can meet (a name too long, a full disk) answer their kind.

    python3 -m unittest discover -s tests/guest -p test_inbox.py -v
"""

import errno
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types
import unittest
from pathlib import Path
from unittest import mock

SOURCE = Path(__file__).resolve().parents[2] / "component" / "guest"
sys.dont_write_bytecode = True  # the folder build.rs watches stays unchanged
sys.path.insert(0, str(SOURCE))
from boxd_helper import cli, files, protocol, pump  # noqa: E402
from boxd_helper.protocol import Fail  # noqa: E402
from boxd_helper.state import Work  # noqa: E402

SID = "ses_root1"


def frame(data):
    return b"%d\n" % len(data) + data + hashlib.sha256(data).hexdigest().encode() + b"\n"


class ThreadSys:
    """Stands in for `sys` in cli and protocol: stdin and stdout per thread, so two
    submits can run at once in one process."""

    def __init__(self):
        self._t = threading.local()
        self.stderr = io.StringIO()

    def use(self, stdin):
        self._t.stdin = types.SimpleNamespace(buffer=io.BytesIO(stdin))
        self._t.stdout = types.SimpleNamespace(buffer=io.BytesIO())

    @property
    def stdin(self):
        return self._t.stdin

    @property
    def stdout(self):
        return self._t.stdout


class FakeOpencode:
    """Just enough of OpenCode's API for the pump: each prompt is a run that ends at once."""

    def __init__(self):
        self.sent, self.msgs = [], []

    def __call__(self, port, password):
        return self

    def get(self, path, timeout=15.0):
        if path == "/session/status":
            return {}
        if path.endswith("/message"):
            return list(self.msgs)
        if path in ("/permission", "/question"):
            return []
        return {"id": SID, "time": {}}

    def call(self, method, path, body=None, timeout=15.0):
        if path.endswith("/prompt_async"):
            text = body["parts"][0]["text"]
            self.sent.append(text)
            self.msgs += [{"info": {"role": "user"}, "parts": []},
                          {"info": {"role": "assistant", "time": {"completed": 1}, "finish": "stop"},
                           "parts": [{"type": "text", "text": "done: " + text}]}]
            return 204, None
        raise AssertionError("unexpected call %s %s" % (method, path))


def in_process(case, prefix, *more):
    """The helper run in this process for `case`: HOME a fresh folder (case.tmp), no server,
    pump or OpenCode started, stdin and stdout a ThreadSys (case.sys); `more` patches too."""
    case.tmp = tempfile.mkdtemp(prefix=prefix)
    case.addCleanup(shutil.rmtree, case.tmp, ignore_errors=True)
    case.sys = ThreadSys()
    for patcher in (mock.patch.dict(os.environ, {"HOME": case.tmp}),
                    mock.patch.object(cli, "ensure_server", lambda work, password, **kw: ("up", {"port": 1})),
                    mock.patch.object(cli, "ensure_pump", lambda work: False),
                    mock.patch.object(cli, "tick", lambda work, lock_timeout=10.0: None),
                    mock.patch.object(cli, "opencode_busy", lambda work, password: False),
                    mock.patch.object(cli, "sys", case.sys),
                    mock.patch.object(protocol, "sys", case.sys), *more):
        patcher.start()
        case.addCleanup(patcher.stop)


class Inbox(unittest.TestCase):
    def setUp(self):
        in_process(self, "boxd-inbox-", mock.patch.object(cli, "ensure_git_exclude", lambda work: None))
        self.work = Work("w1")
        self.work.create()
        with open(self.work.p("password"), "w") as f:
            f.write("pw")
        self.work.set_session_id(SID)
        self.work.save_state(self.work.state())
        self.tree = Path(self.work.tree)

    # -- helpers
    def submit(self, prompt_id, prompt="do it", files=(), frames=None, held=None, **more):
        """cli.main("submit"): (exit code, answer). files: [(to, bytes)]; `held`: {to: [bytes]}
        the laptop holds there; `more` goes into the payload (samePending=True, as the
        laptop sends it)."""
        holds = lambda to: [hashlib.sha256(b).hexdigest() for b in (held or {}).get(to, [])]
        payload = {"promptId": prompt_id, "prompt": prompt, "files": [{"to": to, "held": holds(to)} for to, _ in files], **more}
        body = b"".join(frame(data) for _, data in files) if frames is None else frames
        self.sys.use(json.dumps(payload).encode() + b"\n" + body)
        code = cli.main(["submit", "--work", "w1"])
        return code, json.loads(self.sys.stdout.buffer.getvalue().decode())

    def inbox(self):
        return sorted(os.listdir(self.work.inbox))

    def entry(self, seq, prompt_id, prompt="left by a killed submit"):
        """An inbox entry as an admission writes it before its state write."""
        path = os.path.join(self.work.inbox, "%012d-%s.json" % (seq, prompt_id))
        with open(path, "w") as f:
            json.dump({"seq": seq, "promptId": prompt_id, "prompt": prompt, "admittedAt": "t"}, f)

    def pump(self, ticks=6):
        """Run the pump against a fake OpenCode whose runs end at once: all it was sent."""
        fake = self.opencode = getattr(self, "opencode", None) or FakeOpencode()
        info = {"port": 1, "ready": True, "pid": 1}
        with open(self.work.p("server.json"), "w") as f:
            json.dump(info, f)
        with mock.patch.object(pump, "Api", fake), mock.patch.object(pump, "owned_alive", lambda info, cwd: True):
            for _ in range(ticks):
                pump.tick(self.work, lock_timeout=5.0)
        return fake.sent

    def temps(self):
        return sorted(os.listdir(self.work.p("tmp")))

    # -- 1. an admission killed between its inbox entry and its state write
    def test_an_entry_left_by_a_killed_admission_is_numbered_past_and_counts_as_admitted(self):
        self.entry(1, "p1", "first")  # state.json still says nextSeq 1 and has not seen p1
        code, out = self.submit("p2", "second")
        self.assertEqual(code, 0, out)
        self.assertEqual(self.inbox(), ["000000000001-p1.json", "000000000002-p2.json"])
        # a retry of the half-admitted prompt is a duplicate: its files are not written again
        (self.tree / "f.txt").write_bytes(b"the agent's edit\n")
        code, out = self.submit("p1", "first", files=[("f.txt", b"as sent\n")])
        self.assertEqual((code, out.get("duplicate")), (0, True), out)
        self.assertEqual((self.tree / "f.txt").read_bytes(), b"the agent's edit\n")
        self.assertEqual(len(self.inbox()), 2)
        self.assertEqual(self.work.resolved(["p1", "p2", "p3"]), {"p1": True, "p2": True, "p3": False})
        self.assertEqual(self.pump(), ["first", "second"])
        self.assertEqual(self.inbox(), [])
        self.assertEqual(self.work.resolved(["p1", "p2"]), {"p1": True, "p2": True})

    def test_the_pump_runs_entries_that_share_a_number_and_remembers_them(self):
        # what an older helper left: two entries with one number, one of them never in `seen`
        self.entry(1, "p1", "first")
        self.entry(1, "p2", "second")
        st = self.work.state()
        st.next_seq, st.seen = 2, ["p1"]
        self.work.save_state(st)
        self.assertEqual(self.pump(), ["first", "second"])
        self.assertEqual(self.inbox(), [])
        st = self.work.state()
        self.assertEqual((st.runs, st.current, st.dispatched_seq), (2, None, 1))
        self.assertIn("p2", st.seen)
        self.assertEqual(self.work.resolved(["p1", "p2"]), {"p1": True, "p2": True})
        code, out = self.submit("p3", "third")
        self.assertEqual(code, 0, out)
        self.assertEqual(self.inbox(), ["000000000002-p3.json"])

    def test_a_prompt_dispatched_from_a_half_admitted_entry_is_reported_as_reached(self):
        self.entry(1, "p1", "first")
        self.assertEqual(self.pump(ticks=1), ["first"])
        self.assertEqual(self.work.resolved(["p1"]), {"p1": True}, "running")
        self.assertEqual(self.pump(ticks=2), ["first"])
        self.assertIsNone(self.work.state().current)
        self.assertEqual(self.work.resolved(["p1"]), {"p1": True}, "ran")
        self.assertEqual(self.work.state().newest_prompt, "p1")
        code, out = self.submit("p1", "first")
        self.assertEqual((code, out.get("duplicate")), (0, True), out)

    def test_an_entry_dispatched_just_before_a_crash_is_removed_not_sent_again(self):
        self.entry(1, "p1", "first")
        st = self.work.state()
        st.next_seq, st.dispatched_seq, st.runs, st.seen = 2, 1, 1, ["p1"]
        st.current = {"seq": 1, "promptId": "p1", "sessionId": SID, "sentAt": "t", "baseCount": 0}
        self.work.save_state(st)
        self.assertEqual(self.pump(ticks=1), [])
        self.assertEqual(self.inbox(), [])

    def test_a_full_disk_at_the_state_write_answers_guest_workspace_and_admits_nothing(self):
        def full(st):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        with mock.patch.object(Work, "save_state", lambda self, st: full(st)):
            code, out = self.submit("p1")
        self.assertEqual((code, out["error"]), (3, "GUEST_WORKSPACE"), out)
        self.assertIn("disk is full", out["message"])
        self.assertEqual(self.inbox(), [])
        self.assertEqual(self.work.resolved(["p1"]), {"p1": False})

    # -- 5. the duplicate check and the admission are one critical section
    def test_two_simultaneous_submits_of_one_id_write_its_files_once(self):
        real_write, placed, other = files.write_files, [], {}

        def second_submit():
            other["answer"] = self.submit("p1", files=[("f.txt", b"second\n")])

        def write_files(work, received, keep):
            if received and not placed:
                # the first submit is about to place its files: the same id arrives again
                t = threading.Thread(target=second_submit)
                t.start()
                t.join(1.5)
                other["thread"] = t
            if received:
                placed.append([r[0] for r in received])
            return real_write(work, received, keep)

        with mock.patch.object(cli, "write_files", write_files):
            code, out = self.submit("p1", files=[("f.txt", b"first\n")])
            other["thread"].join(60)
        self.assertEqual(code, 0, out)
        self.assertEqual(len(placed), 1, "the files of one prompt are written once")
        self.assertEqual(other["answer"][0], 0, other)
        self.assertEqual([out.get("duplicate", False), other["answer"][1].get("duplicate", False)].count(True), 1)
        self.assertEqual(len(self.inbox()), 1)
        self.assertEqual(self.temps(), [])

    # -- 2. a refused submit writes nothing
    def test_a_target_that_is_a_folder_of_another_is_refused_before_any_frame(self):
        (self.tree / "x.txt").write_bytes(b"the agent's edit\n")
        both = [("x.txt", b"sent\n"), ("n", b"x"), ("n/b", b"y")]
        code, out = self.submit("p1", files=both, frames=b"")
        self.assertEqual((code, out["error"], out["path"]), (3, "NAME_INVALID", "n"), out)
        code, out = self.submit("p1", files=both)
        self.assertEqual((code, out["error"]), (3, "NAME_INVALID"), out)
        code, out = self.submit("p1", files=[("x.txt", b"sent\n"), ("d/e/f", b"x"), ("d/e", b"y")])
        self.assertEqual((code, out["error"]), (3, "NAME_INVALID"), out)
        self.assertEqual((self.tree / "x.txt").read_bytes(), b"the agent's edit\n")
        self.assertFalse((self.tree / "n").exists())
        self.assertFalse((self.tree / "d").exists())
        self.assertEqual((self.inbox(), self.temps()), ([], []))
        code, out = self.submit("p1", files=[("n2", b"x"), ("n2b/c", b"y")])  # a shared prefix is no folder
        self.assertEqual(code, 0, out)

    def test_a_file_the_laptop_does_not_hold_is_never_replaced(self):
        """The agent's output no harvest brought home: a submit to its path is refused whole
        (FILE_CONFLICT, "admitted": false), nothing placed; bytes the laptop holds there
        (`held`), the same bytes, or what HEAD holds are replaced as before."""
        (self.tree / "results.csv").write_bytes(b"the agent's output\n")
        (self.tree / "other.txt").write_bytes(b"old\n")
        code, out = self.submit("p1", files=[("other.txt", b"new\n"), ("results.csv", b"mine\n")])
        self.assertEqual((code, out["error"], out["path"], out["admitted"]), (3, "FILE_CONFLICT", "other.txt", False), out)
        self.assertEqual(out["paths"], ["other.txt", "results.csv"], out)
        self.assertEqual(((self.tree / "results.csv").read_bytes(), (self.tree / "other.txt").read_bytes()), (b"the agent's output\n", b"old\n"))
        self.assertEqual((self.inbox(), self.temps()), ([], []))
        self.assertEqual(self.work.resolved(["p1"]), {"p1": False})
        held = hashlib.sha256(b"the agent's output\n").hexdigest()
        same = [{"to": "results.csv", "held": [held]}, {"to": "other.txt", "held": []}]
        self.sys.use(json.dumps({"promptId": "p2", "prompt": "do it", "files": same}).encode() + b"\n" + frame(b"mine\n") + frame(b"old\n"))
        code = cli.main(["submit", "--work", "w1"])
        out = json.loads(self.sys.stdout.buffer.getvalue().decode())
        self.assertEqual(code, 0, out)
        self.assertEqual((self.tree / "results.csv").read_bytes(), b"mine\n", "held by the laptop: replaced")

    def test_bytes_a_submit_placed_may_be_replaced_though_the_laptop_never_heard(self):
        """A submit whose answer was lost placed its file, and the laptop holds no record of
        it: those bytes came from the laptop (placed.json), so a later submit replaces them;
        once the agent has changed them, it does not."""
        self.assertEqual(self.submit("p1", "one", files=[("f.txt", b"v1\n")])[0], 0)
        code, out = self.submit("p2", "two", files=[("f.txt", b"v2\n")])
        self.assertEqual(code, 0, out)
        self.assertEqual((self.tree / "f.txt").read_bytes(), b"v2\n")
        (self.tree / "f.txt").write_bytes(b"the agent's edit\n")
        code, out = self.submit("p3", "three", files=[("f.txt", b"v3\n")])
        self.assertEqual((code, out["error"]), (3, "FILE_CONFLICT"), out)
        self.assertEqual((self.tree / "f.txt").read_bytes(), b"the agent's edit\n")

    def test_a_target_past_the_file_cap_is_refused_unread(self):
        with open(self.tree / "big.bin", "wb") as f:
            f.truncate(files.FILE_MAX + 1)
        with mock.patch.object(files, "committed", lambda *a: self.fail("a file past the cap is not hashed")):
            code, out = self.submit("p1", files=[("big.bin", b"small\n")])
        self.assertEqual((code, out["error"], out["path"]), (3, "FILE_CONFLICT", "big.bin"), out)
        self.assertEqual(os.path.getsize(self.tree / "big.bin"), files.FILE_MAX + 1)

    def test_a_committed_file_is_replaced_but_not_one_whose_staged_version_differs(self):
        env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")

        def git(*argv):
            subprocess.run(["git", "-C", str(self.tree)] + list(argv), check=True, env=env, capture_output=True)
        git("init", "-q")
        for name in ("f.txt", "g.txt"):
            (self.tree / name).write_bytes(b"v1\n")
        git("add", "f.txt", "g.txt")
        git("commit", "-qm", "one")
        code, out = self.submit("p1", "one", files=[("f.txt", b"laptop\n")])
        self.assertEqual(code, 0, out)  # HEAD holds what it replaced
        (self.tree / "g.txt").write_bytes(b"v2, staged\n")
        git("add", "g.txt")
        (self.tree / "g.txt").write_bytes(b"v1\n")  # the file as HEAD has it; the index holds v2
        code, out = self.submit("p2", "two", files=[("g.txt", b"laptop\n")])
        self.assertEqual((code, out["error"], out["path"]), (3, "FILE_CONFLICT", "g.txt"), out)
        # A clean filter drops bytes on the way into a commit (nbstripout, LFS): the file's
        # own bytes are in no commit, though git reads it as HEAD's.
        git("config", "filter.firstline.clean", "head -n1")
        (self.tree / ".gitattributes").write_bytes(b"*.nb filter=firstline\n")
        (self.tree / "n.nb").write_bytes(b"code\n")
        git("add", ".gitattributes", "n.nb")
        git("commit", "-qm", "three")
        (self.tree / "n.nb").write_bytes(b"code\nthe outputs, only here\n")
        code, out = self.submit("p3", "three", files=[("n.nb", b"laptop\n")])
        self.assertEqual((code, out["error"], out["path"]), (3, "FILE_CONFLICT", "n.nb"), out)

    def test_a_file_the_agent_writes_while_the_submit_places_is_not_replaced(self):
        (self.tree / "a.txt").write_bytes(b"sent before\n")
        (self.tree / "b.txt").write_bytes(b"sent before\n")
        held = {"a.txt": [b"sent before\n"], "b.txt": [b"sent before\n"]}
        real = files.unheld
        calls = []

        def agent_writes_b_after_the_check(work, received, keep):
            calls.append(len(received))
            if len(calls) == 2:  # the first file's own look, right before its rename
                (self.tree / "b.txt").write_bytes(b"the agent, meanwhile\n")
            return real(work, received, keep)
        with mock.patch.object(files, "unheld", agent_writes_b_after_the_check):
            code, out = self.submit("p1", files=[("a.txt", b"new\n"), ("b.txt", b"new\n")], held=held)
        self.assertEqual((code, out["error"], out["path"], out["admitted"]), (3, "FILE_CONFLICT", "b.txt", False), out)
        self.assertEqual((self.tree / "b.txt").read_bytes(), b"the agent, meanwhile\n")
        self.assertEqual(self.inbox(), [])

    def test_a_refusal_before_admission_says_nothing_was_admitted(self):
        code, out = self.submit("p1", files=[("a", b"x"), ("a", b"y")])
        self.assertEqual((code, out["error"], out["admitted"]), (3, "NAME_INVALID", False), out)

    def test_nothing_is_placed_until_every_target_is_checked(self):
        outside = Path(self.tmp) / "outside"
        outside.mkdir()
        planned = files.plan_files(self.work, [{"to": "a.txt"}, {"to": "d/x.txt"}])
        received = files.receive_files(self.work, planned, io.BytesIO(frame(b"a") + frame(b"x")))
        os.symlink(str(outside), str(self.tree / "d"))  # the agent, meanwhile
        with self.assertRaises(Fail) as e:
            files.write_files(self.work, received, {})
        self.assertEqual(e.exception.kind, "NAME_INVALID")
        self.assertFalse((self.tree / "a.txt").exists())
        self.assertEqual((os.listdir(outside), self.temps()), ([], []))

    # -- 3. the kinds of the failures a guest meets
    def test_a_name_too_long_is_name_invalid(self):
        long_name = "x" * 256
        for to in (long_name, "a/" + long_name + "/b", "\u00e9" * 128):
            code, out = self.submit("p1", files=[(to, b"x")])
            self.assertEqual((code, out["error"]), (3, "NAME_INVALID"), (to, out))
        code, out = self.submit("p1", files=[("y" * 255, b"x")])
        self.assertEqual(code, 0, out)
        with self.assertRaises(Fail) as e:
            files.read_requested(self.work, [long_name])
        self.assertEqual(e.exception.kind, "NAME_INVALID")
        code, out = self.submit("p1", files=[("/".join(["z" * 200] * 25), b"x")])  # past PATH_MAX
        self.assertEqual((code, out["error"]), (3, "NAME_INVALID"), out)
        self.assertEqual(self.inbox(), ["000000000001-p1.json"])

    def test_a_full_disk_while_receiving_is_guest_workspace(self):
        def full(stream, fd, what):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        with mock.patch.object(files, "copy_frame", full):
            code, out = self.submit("p1", files=[("a.txt", b"a")])
        self.assertEqual((code, out["error"]), (3, "GUEST_WORKSPACE"), out)
        self.assertIn("disk is full", out["message"])
        self.assertEqual((self.inbox(), self.temps()), ([], []))

    def test_a_full_disk_writing_the_inbox_entry_is_guest_workspace(self):
        real = cli.atomic_write

        def atomic_write(path, data, **kw):
            if "/inbox/" in path:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(path, data, **kw)

        with mock.patch.object(cli, "atomic_write", atomic_write):
            code, out = self.submit("p1")
        self.assertEqual((code, out["error"]), (3, "GUEST_WORKSPACE"), out)
        self.assertIn("disk is full", out["message"])
        self.assertEqual(self.work.resolved(["p1"]), {"p1": False})

    # -- 4. receive temps a killed helper left
    def test_a_submit_sweeps_old_receive_temps(self):
        old, new, other = (Path(self.work.p("tmp")) / n for n in ("in-old.boxd-tmp", "in-new.boxd-tmp", "import-x.json"))
        for p in (old, new, other):
            p.write_bytes(b"x" * 1024)
        two_hours_ago = time.time() - 7200
        os.utime(old, (two_hours_ago, two_hours_ago))
        os.utime(other, (two_hours_ago, two_hours_ago))
        code, out = self.submit("p1")
        self.assertEqual(code, 0, out)
        self.assertEqual(self.temps(), ["import-x.json", "in-new.boxd-tmp"])


if __name__ == "__main__":
    unittest.main()


class SamePending(Inbox):
    """A submit of the same text and files as a prompt still waiting or running, under
    another id (a retry whose first call ran on after its client gave up, or two places at
    once), is that prompt's duplicate: it runs once. After that run has ended the same words
    are a prompt of their own. Each test fails on the helper before the rule (it admitted
    the second id and ran the text twice)."""

    # the Inbox tests are not run again here
    locals().update({name: None for name in dir(Inbox) if name.startswith("test_")})

    def test_a_retry_while_the_first_waits_is_its_duplicate_and_places_nothing(self):
        code, out = self.submit("p1", "same words", files=[("f.txt", b"v1\n")], samePending=True)
        self.assertEqual((code, out.get("duplicate")), (0, None), out)
        (self.tree / "f.txt").write_bytes(b"the agent's edit\n")
        code, out = self.submit("p2", "same words", files=[("f.txt", b"v1\n")], samePending=True)
        self.assertEqual((code, out.get("duplicate"), out.get("duplicateOf")), (0, True, "p1"), out)
        self.assertEqual((self.tree / "f.txt").read_bytes(), b"the agent's edit\n", "its file was not placed again")
        self.assertEqual(self.inbox(), ["000000000001-p1.json"])
        self.assertEqual(self.temps(), [])
        self.assertEqual(self.work.resolved(["p2"]), {"p2": False})
        self.assertEqual(self.pump(), ["same words"])

    def test_a_retry_while_the_first_runs_is_its_duplicate(self):
        self.submit("p1", "same words", samePending=True)
        self.opencode = FakeOpencode()
        self.opencode.get = lambda path, timeout=15.0, _get=self.opencode.get: (
            {SID: {"type": "busy"}} if path == "/session/status" and self.opencode.sent else _get(path, timeout))
        self.assertEqual(self.pump(ticks=2), ["same words"])
        self.assertEqual(self.work.state().current["promptId"], "p1", "still running")
        code, out = self.submit("p2", "same words", samePending=True)
        self.assertEqual((code, out.get("duplicateOf")), (0, "p1"), out)
        self.assertEqual(self.inbox(), [])

    def test_the_same_words_after_the_run_ended_run_again(self):
        self.submit("p1", "continue", samePending=True)
        self.assertEqual(self.pump(), ["continue"])
        self.assertIsNone(self.work.state().current)
        code, out = self.submit("p2", "continue", samePending=True)
        self.assertEqual((code, out.get("duplicate")), (0, None), out)
        self.assertEqual(self.pump(), ["continue", "continue"])

    def test_other_text_other_bytes_an_older_laptop_or_an_older_entry_are_admitted(self):
        self.submit("p1", "words", files=[("f.txt", b"v1\n")], samePending=True)
        for pid, prompt, data, more in [("p2", "other words", b"v1\n", {"samePending": True}),
                                        ("p3", "words", b"v2\n", {"samePending": True}),
                                        ("p4", "words", b"v1\n", {})]:
            code, out = self.submit(pid, prompt, files=[("f.txt", data)], held={"f.txt": [b"v1\n", b"v2\n"]}, **more)
            self.assertEqual((code, out.get("duplicate")), (0, None), (pid, out))
        self.entry(9, "p9", "older")  # an older helper's admission: no key
        code, out = self.submit("p10", "older", samePending=True)
        self.assertEqual((code, out.get("duplicate")), (0, None), out)
        self.assertEqual(len(self.inbox()), 6)

    def test_two_simultaneous_submits_of_one_text_admit_it_once(self):
        answers, barrier = {}, threading.Barrier(2)
        real_receive = cli.receive_files

        def receive(*a):
            got = real_receive(*a)
            barrier.wait(5)  # both have read their frames before either takes the lock
            return got

        def go(pid):
            answers[pid] = self.submit(pid, "at once", files=[("f.txt", b"x")], samePending=True)
        with mock.patch.object(cli, "receive_files", receive):
            threads = [threading.Thread(target=go, args=(p,)) for p in ("pa", "pb")]
            [t.start() for t in threads]
            [t.join() for t in threads]
        dups = [(pid, out.get("duplicateOf")) for pid, (code, out) in answers.items() if out.get("duplicate")]
        self.assertEqual(len(dups), 1, answers)
        self.assertEqual(len(self.inbox()), 1)
        self.assertEqual(self.inbox()[0].split("-", 1)[1], "%s.json" % dups[0][1])
        self.assertEqual(self.pump(), ["at once"])
