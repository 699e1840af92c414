"""The agent cleans its work tree: the helper's state (inbox, counters, session id) is not
in it, so `git clean` in any form leaves it; a work an older helper prepared is moved out
of the tree; state removed all the same answers GUEST_STATE_LOST, and the work's root
session is found again in OpenCode rather than a new one hiding the earlier runs.

    python3 -m unittest discover -s tests/guest -p test_cleaning.py -v
"""

import json
import os
import shutil
import subprocess
import sys
import unittest
from pathlib import Path
from unittest import mock

from test_inbox import SID, FakeOpencode, in_process  # noqa: E402  (puts the helper on sys.path)
from boxd_helper import cli, pump  # noqa: E402
from boxd_helper.procs import identity, pid_alive  # noqa: E402
from boxd_helper.state import Work  # noqa: E402
from boxd_helper import state as state_module, protocol as protocol_module  # noqa: E402


def git(tree, *args):
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True, env=env)


class Listing(FakeOpencode):
    """A fake OpenCode that also lists its sessions and exports them."""

    def __init__(self, sessions):
        super().__init__()
        self.sessions, self.created = sessions, []

    def get(self, path, timeout=15.0):
        if path == "/session":
            return list(self.sessions)
        if path.endswith("/children"):
            return []
        return super().get(path, timeout)

    def call(self, method, path, body=None, timeout=15.0):
        if (method, path) == ("POST", "/session"):
            self.created.append(body)
            return 200, {"id": "ses_new1"}
        return super().call(method, path, body, timeout)


class Cleaning(unittest.TestCase):
    def setUp(self):
        in_process(self, "boxd-clean-")
        self.work = self.prepared("w1")
        self.tree = Path(self.work.tree)
        git(self.tree, "init", "-q")
        git(self.tree, "commit", "-q", "--allow-empty", "-m", "start")

    def prepared(self, work_id):
        work = Work(work_id)
        work.create()
        with open(work.p("password"), "w") as f:
            f.write("pw")
        work.set_session_id(SID)
        work.save_state(work.state())
        return work

    def main(self, *argv, stdin=b""):
        self.sys.use(stdin)
        code = cli.main(list(argv) + ["--work", "w1"])
        return code, json.loads(self.sys.stdout.buffer.getvalue().decode())

    def submit(self, prompt_id, prompt):
        return self.main("submit", stdin=json.dumps({"promptId": prompt_id, "prompt": prompt, "files": []}).encode() + b"\n")

    def run_pump(self, fake, ticks=6):
        with open(self.work.p("server.json"), "w") as f:
            json.dump({"port": 1, "ready": True, "pid": 1}, f)
        with mock.patch.object(pump, "Api", fake), mock.patch.object(pump, "owned_alive", lambda info, cwd: True):
            for _ in range(ticks):
                pump.tick(self.work, lock_timeout=5.0)
        return fake.sent

    def test_git_clean_of_the_tree_in_every_form_leaves_the_inbox_counters_and_session(self):
        for i in (1, 2):
            code, out = self.submit("p%d" % i, "do %d" % i)
            self.assertEqual(code, 0, out)
        (self.tree / "scratch.txt").write_text("the agent's")
        for flags in ("-fdx", "-fdX", "-fd", "-ffdx"):
            git(self.tree, "clean", flags, "-q")
        self.assertFalse((self.tree / "scratch.txt").exists(), "the clean ran")
        self.assertEqual(self.work.session_id(), SID)
        self.assertEqual(self.work.resolved(["p1", "p2"]), {"p1": True, "p2": True})
        self.assertEqual(self.run_pump(FakeOpencode()), ["do 1", "do 2"], "the waiting prompts still run, once each")
        code, out = self.main("status")
        self.assertEqual((code, out["runs"], out["pending"], out["sessionId"]), (0, 2, 0, SID), out)

    def test_state_removed_by_hand_answers_guest_state_lost_not_work_unknown(self):
        code, out = self.submit("p1", "do 1")
        self.assertEqual(code, 0, out)
        shutil.rmtree(self.work.boxd)
        for argv, stdin in ((("status",), b""), (("export",), b""), (("seal",), b""),
                            (("submit",), json.dumps({"promptId": "p2", "prompt": "x", "files": []}).encode() + b"\n")):
            code, out = self.main(*argv, stdin=stdin)
            self.assertEqual((code, out.get("error")), (3, "GUEST_STATE_LOST"), (argv, out))
            self.assertIn("waiting to start went with it and will not run", out["message"])
        # a work that never had a tree here is still one the machine does not know
        self.sys.use(b"")
        self.assertEqual(cli.main(["status", "--work", "w9"]), 3)
        self.assertEqual(json.loads(self.sys.stdout.buffer.getvalue())["error"], "WORK_UNKNOWN")

    def test_after_the_state_is_removed_the_root_session_is_found_again_not_made_anew(self):
        first = FakeOpencode()
        self.assertEqual(self.run_pump(first), [])
        self.submit("p1", "do 1")
        self.run_pump(first)
        shutil.rmtree(self.work.boxd)
        self.work = self.prepared("w1")
        os.unlink(self.work.p("session"))  # as prepare leaves it: made again, no session id
        listed = [{"id": "ses_other", "title": "boxd work w10", "time": {"created": 1}},
                  {"id": "ses_child", "parentID": SID, "title": "boxd work w1", "time": {"created": 1}},
                  {"id": SID, "title": "boxd work w1", "time": {"created": 5}},
                  {"id": "ses_later", "title": "boxd work w1", "time": {"created": 9}}]
        fake = Listing(listed)
        fake.msgs = list(first.msgs)
        with mock.patch.object(cli, "Api", fake):
            code, out = self.main("export")
        self.assertEqual(code, 0, out)
        self.assertEqual([s["info"]["id"] for s in out["sessions"]], [SID], "the earlier runs are exported")
        self.assertEqual(len(out["sessions"][0]["messages"]), 2)
        self.assertEqual(self.work.session_id(), SID)
        self.assertEqual(fake.created, [], "no new root session")
        # the next prompt continues that session
        self.submit("p2", "do 2")
        self.assertEqual(self.run_pump(fake), ["do 2"])
        self.assertEqual((self.work.session_id(), fake.created), (SID, []))

    def test_a_state_made_again_says_it_forgot_what_the_lost_one_admitted(self):
        code, out = self.submit("p1", "do 1")
        self.assertEqual(code, 0, out)
        shutil.rmtree(self.work.boxd)
        fake = Listing([{"id": SID, "title": "boxd work w1", "time": {"created": 5}}])
        with mock.patch.object(cli, "find_opencode", lambda: "/bin/true"), \
                mock.patch.object(cli, "opencode_version", lambda binary: "1.18.33"), \
                mock.patch.object(cli, "servers_in", lambda tree: []), \
                mock.patch.object(cli, "ensure_repo", lambda work: "existing"), \
                mock.patch.object(cli, "Api", fake), mock.patch.object(pump, "Api", fake):
            code, out = self.main("prepare", "--opencode-version", "1.18.33", stdin=b"pw\n")
            self.assertEqual(code, 0, out)
            self.assertEqual(out["stateRecreated"]["sessionId"], SID)
            forgot = self.work.state().forgot_at
            self.assertTrue(forgot)
            # A second prepare keeps the first mark.
            self.main("prepare", "--opencode-version", "1.18.33", stdin=b"pw\n")
            self.assertEqual(self.work.state().forgot_at, forgot)
            code, out = self.main("export", "--resolve", "p1")
        self.assertEqual(code, 0, out)
        self.assertEqual((out["forgotAt"], out["resolved"]), (forgot, {"p1": False}), out)
        # A work whose state never went says nothing of the kind.
        fresh = self.prepared("w2")
        self.assertIsNone(fresh.state().forgot_at)

    def test_a_work_an_older_helper_prepared_in_the_tree_is_moved_out_with_its_pump_stopped(self):
        tree = Path(self.tmp) / "work" / "w2"
        legacy = tree / ".boxd"
        (legacy / "inbox").mkdir(parents=True)
        (legacy / "tmp").mkdir()
        (legacy / "password").write_text("pw")
        (legacy / "session").write_text(SID + "\n")
        (legacy / "state.json").write_text(json.dumps({"version": 1, "nextSeq": 2, "seen": ["p1"]}))
        (legacy / "inbox" / "000000000001-p1.json").write_text(
            json.dumps({"seq": 1, "promptId": "p1", "prompt": "old", "admittedAt": "t"}))
        old_pump = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=str(legacy),
                                    start_new_session=True)
        self.addCleanup(old_pump.kill)
        (legacy / "pump.json").write_text(json.dumps(identity(old_pump.pid, str(legacy))))
        work = Work("w2")
        self.assertEqual(work.boxd, os.path.join(self.tmp, ".boxd-helper", "works", "w2"))
        self.assertTrue(legacy.is_symlink() and legacy.resolve() == Path(work.boxd).resolve(),
                        "the old place is a link to the state, for an older helper to find it")
        self.assertEqual(old_pump.wait(timeout=10), -15, "the old pump was stopped")
        self.assertFalse(pid_alive(old_pump.pid))
        self.assertEqual((work.session_id(), work.password()), (SID, "pw"))
        self.assertEqual(work.resolved(["p1"]), {"p1": True})
        self.assertEqual([n for _, n in work.waiting(work.state())], ["000000000001-p1.json"])
        # and a second look finds it there, with nothing moved again
        self.assertEqual(Work("w2").session_id(), SID)

    def test_a_move_another_command_holds_the_lock_for_answers_busy_never_the_old_folder(self):
        legacy = Path(self.tmp) / "work" / "w3" / ".boxd"
        (legacy / "inbox").mkdir(parents=True)
        (legacy / "password").write_text("pw")

        class Held:
            def __init__(self, path, timeout):
                pass

            def __enter__(self):
                raise TimeoutError("lock is held by another helper")

            def __exit__(self, *exc):
                return False

        with mock.patch.object(state_module, "FileLock", Held):
            with self.assertRaises(protocol_module.Fail) as caught:
                Work("w3")
        self.assertEqual(caught.exception.kind, "SESSION_BUSY")
        self.assertTrue((legacy / "password").is_file(), "nothing moved, nothing made beside it")
        self.assertFalse(os.path.lexists(os.path.join(self.tmp, ".boxd-helper", "works", "w3")))

    def test_prepare_links_the_old_place_to_the_state_for_an_older_helper(self):
        work = self.prepared("w4")
        legacy = Path(work.tree) / ".boxd"
        self.assertTrue(legacy.is_symlink() and legacy.resolve() == Path(work.boxd).resolve())
        git(Path(work.tree), "init", "-q")
        cli.ensure_git_exclude(work)
        self.assertEqual(git(Path(work.tree), "status", "--porcelain").stdout, b"", "git does not see the link")


if __name__ == "__main__":
    unittest.main()
