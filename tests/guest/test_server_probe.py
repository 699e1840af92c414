"""A server that does not answer its health check is hung only when it is not working:
one that keeps using CPU (its event loop blocked by a first prompt's start-up on a small or
busy machine, or waiting on a child such as git) is asked again, up to BUSY_PATIENCE in all.
Before, one 5 s silence on a busy machine made boxd_job answer GUEST_FAILED and tell the
user to rebuild a machine that was only working.

The server here is a stand-in process in its own session, like the helper starts
`opencode serve`: it accepts connections and answers /global/health, but first does what
each test names. The probe's waits are shortened (one ask 1 s, patience 4 s).

    python3 -m unittest discover -s tests/guest -p test_server_probe.py -v
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path
from unittest import mock

SOURCE = Path(__file__).resolve().parents[2] / "component" / "guest"
sys.dont_write_bytecode = True  # the folder build.rs watches stays unchanged
sys.path.insert(0, str(SOURCE))
from boxd_helper import server  # noqa: E402
from boxd_helper.procs import identity  # noqa: E402

# argv: what to do when the first ask arrives (busy S | child S | exit S: busy, then end
# without answering | nothing), then answer every ask.
STAND_IN = r'''
import socket, subprocess, sys, time
what, seconds = sys.argv[1], float(sys.argv[2])
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
first = True
while True:
    conn, _ = s.accept()
    if first and what in ("busy", "exit"):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        if what == "exit":
            sys.exit(0)
    if first and what == "child":
        subprocess.run([sys.executable, "-c", "import time\nend = time.monotonic() + %f\nwhile time.monotonic() < end: pass" % seconds])
    first = False
    conn.recv(65536)
    body = b'{"healthy": true, "version": "1.18.33"}'
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    conn.close()
'''


class StandInWork:
    """What probe_server reads of a work: its tree and its server.json."""

    def __init__(self, tree, info):
        self.tree, self.info = tree, info

    def server_info(self):
        return dict(self.info)


class BusyIsNotHung(unittest.TestCase):
    def setUp(self):
        self.tree = tempfile.mkdtemp(prefix="boxd-probe-")
        self.addCleanup(shutil.rmtree, self.tree, ignore_errors=True)
        self.procs = []
        patches = [mock.patch.object(server, "HEALTH_TIMEOUT", 1.0), mock.patch.object(server, "BUSY_PATIENCE", 4.0)]
        for p in patches:
            p.start()
            self.addCleanup(p.stop)

    def tearDown(self):
        for proc in self.procs:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except OSError:
                    pass
            proc.wait(5)
            proc.stdout.close()

    def stand_in(self, what, seconds=0.0):
        proc = subprocess.Popen([sys.executable, "-c", STAND_IN, what, str(seconds)], cwd=self.tree,
                                stdout=subprocess.PIPE, start_new_session=True)
        self.procs.append(proc)
        port = int(proc.stdout.readline())
        return proc, StandInWork(self.tree, dict(identity(proc.pid, self.tree), port=port))

    def probe(self, work):
        started = time.monotonic()
        how, _, detail = server.probe_server(work, "pw")
        return how, detail, time.monotonic() - started

    def test_a_server_busy_past_one_ask_is_up(self):
        _, work = self.stand_in("busy", 2.5)
        how, detail, took = self.probe(work)
        self.assertEqual(how, "up", detail)
        self.assertGreater(took, 1.0, "the first ask timed out and the probe asked again")

    def test_a_server_waiting_on_a_busy_child_is_up(self):
        _, work = self.stand_in("child", 2.5)
        how, detail, took = self.probe(work)
        self.assertEqual(how, "up", detail)
        self.assertGreater(took, 1.0)

    def test_a_stopped_server_is_hung_after_one_ask(self):
        proc, work = self.stand_in("nothing")
        os.kill(proc.pid, signal.SIGSTOP)
        how, detail, took = self.probe(work)
        self.assertEqual(how, "hung")
        self.assertIn("did not answer within 1 s, and was not working", detail)
        self.assertLess(took, 3.0, "nothing was working: no second ask")

    def test_a_server_busy_for_ever_is_hung_after_the_patience(self):
        _, work = self.stand_in("busy", 120)
        how, detail, took = self.probe(work)
        self.assertEqual(how, "hung")
        self.assertIn("working all along", detail)
        self.assertGreaterEqual(took, 3.9)
        self.assertLess(took, 4.0 + 1.5, "the last ask ends with the patience")

    def test_a_server_that_ends_while_it_is_asked_is_dead_not_hung(self):
        # dead is restarted by the next tool; hung would tell the user to rebuild the machine.
        for seconds in (0.0, 1.5):  # at once, and after one ask timed out while it worked
            proc, work = self.stand_in("exit", seconds)
            how, detail, took = self.probe(work)
            self.assertEqual(how, "dead", detail)
            self.assertEqual(proc.wait(5), 0, "it ended on its own")
            self.assertLess(took, 3.0)

    def test_a_server_that_answers_is_up_at_once(self):
        _, work = self.stand_in("nothing")
        how, detail, took = self.probe(work)
        self.assertEqual(how, "up", detail)
        self.assertLess(took, 1.0)


if __name__ == "__main__":
    unittest.main()
