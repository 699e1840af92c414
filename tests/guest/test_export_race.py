"""export reads the sessions while nothing runs: a run that starts (or starts and ends)
between its busy check and its reads would send the laptop a half-written transcript,
which the laptop's import keeps for ever under the same ids. It answers SESSION_BUSY.

    python3 -m unittest discover -s tests/guest -p test_export_race.py -v
"""

import argparse
import os
import shutil
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

SOURCE = Path(__file__).resolve().parents[2] / "component" / "guest"
sys.dont_write_bytecode = True  # the folder build.rs watches stays unchanged
sys.path.insert(0, str(SOURCE))
from boxd_helper import cli  # noqa: E402
from boxd_helper.protocol import Fail  # noqa: E402
from boxd_helper.state import Work  # noqa: E402

SID = "ses_root1"


class ExportRace(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="boxd-export-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        patcher = mock.patch.dict(os.environ, {"HOME": self.tmp})
        patcher.start()
        self.addCleanup(patcher.stop)
        self.work = Work("w1")
        self.work.create()
        self.work.set_session_id(SID)
        self.work.save_state(self.work.state())

    def export(self, on_messages):
        """cmd_export against a fake OpenCode whose first /message read calls `on_messages`."""
        work, reads = self.work, []

        class FakeApi:
            def __init__(self, port, password):
                pass

            def get(self, path, timeout=15.0):
                if path == "/session/status":
                    return {}
                if path.endswith("/message"):
                    if not reads:
                        on_messages(work)
                    reads.append(path)
                    return [{"info": {"id": "msg_1", "role": "user"}, "parts": []}]
                if path.endswith("/children"):
                    return []
                return {"id": SID}

        with mock.patch.object(cli, "ready_work", lambda args: (work, "pw", "up", {"port": 1})), mock.patch.object(cli, "Api", FakeApi):
            return cli.cmd_export(argparse.Namespace(work="w1", resolve="", command="export"))

    def test_an_export_with_nothing_running_answers_the_sessions(self):
        out = self.export(lambda work: None)
        self.assertEqual([s["info"]["id"] for s in out["sessions"]], [SID])

    def test_a_run_started_while_the_sessions_were_read_answers_session_busy(self):
        def start_run(work):
            st = work.state()
            st.next_seq, st.dispatched_seq = 2, 1
            st.current = {"seq": 1, "promptId": "p1", "sessionId": SID}
            work.save_state(st)

        with self.assertRaises(Fail) as e:
            self.export(start_run)
        self.assertEqual(e.exception.kind, "SESSION_BUSY")

    def test_a_run_that_started_and_ended_while_the_sessions_were_read_answers_session_busy(self):
        def start_and_end_run(work):
            st = work.state()
            st.next_seq, st.dispatched_seq, st.runs = 2, 1, 1
            work.save_state(st)

        with self.assertRaises(Fail) as e:
            self.export(start_and_end_run)
        self.assertEqual(e.exception.kind, "SESSION_BUSY")


if __name__ == "__main__":
    unittest.main()
