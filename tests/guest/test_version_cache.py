"""The guest's `opencode --version` is asked once per binary: prepare runs on every ensure
and resume, and the ask costs a second or more. A binary replaced or updated in place is
asked again; a cache that is broken or unwritable only costs the ask.

    python3 -m unittest discover -s tests/guest -p test_version_cache.py -v
"""

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from unittest import mock
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "component" / "guest"
sys.dont_write_bytecode = True  # the folder build.rs watches stays unchanged
sys.path.insert(0, str(SOURCE))
from boxd_helper import opencode  # noqa: E402
from boxd_helper.protocol import Fail  # noqa: E402


class VersionCache(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="boxd-version-"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.home = self.tmp / "home"
        self.home.mkdir()
        self.asks = self.tmp / "asks"
        self.binary = self.tmp / "opencode"
        self.write_binary("1.18.33")
        self._home = os.environ.get("HOME")
        os.environ["HOME"] = str(self.home)

    def tearDown(self):
        if self._home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = self._home

    def write_binary(self, version, code=0):
        # Each run appends a line to `asks`: the test counts how often the binary was asked.
        self.binary.write_text("#!/bin/sh\necho x >> '%s'\necho %s\nexit %d\n" % (self.asks, version, code))
        self.binary.chmod(0o755)

    def asked(self):
        return len(self.asks.read_text().splitlines()) if self.asks.exists() else 0

    def cache(self):
        return self.home / ".boxd-helper" / "opencode-version.json"

    def test_asked_once_per_binary(self):
        self.assertEqual(opencode.opencode_version(str(self.binary)), "1.18.33")
        self.assertEqual(opencode.opencode_version(str(self.binary)), "1.18.33")
        self.assertEqual(self.asked(), 1)
        self.assertEqual(json.loads(self.cache().read_text())["version"], "1.18.33")

    def test_a_replaced_binary_is_asked_again(self):
        opencode.opencode_version(str(self.binary))
        self.write_binary("1.18.34")  # same path, new content: size or times differ
        os.utime(self.binary, ns=(1, 1))
        self.assertEqual(opencode.opencode_version(str(self.binary)), "1.18.34")
        self.assertEqual(self.asked(), 2)

    def test_a_symlink_is_keyed_by_what_it_points_at(self):
        link = self.tmp / "opencode-link"
        link.symlink_to(self.binary)
        opencode.opencode_version(str(link))
        opencode.opencode_version(str(self.binary))
        self.assertEqual(self.asked(), 1, "one binary behind two names is asked once")

    def test_a_broken_cache_is_asked_again_and_rewritten(self):
        self.cache().parent.mkdir(parents=True)
        for junk in (b"{not json", b"[]", b'{"key": 1, "version": 7}'):
            self.cache().write_bytes(junk)
            self.assertEqual(opencode.opencode_version(str(self.binary)), "1.18.33")
        self.assertEqual(self.asked(), 3)
        self.assertEqual(json.loads(self.cache().read_text())["version"], "1.18.33")

    def test_an_unwritable_cache_still_answers(self):
        self.cache().mkdir(parents=True)  # a folder where the file goes: reading and writing fail
        self.assertEqual(opencode.opencode_version(str(self.binary)), "1.18.33")
        self.assertEqual(opencode.opencode_version(str(self.binary)), "1.18.33")
        self.assertEqual(self.asked(), 2)

    def test_a_failing_binary_is_guest_version_and_not_cached(self):
        self.write_binary("", code=3)
        with self.assertRaises(Fail) as e:
            opencode.opencode_version(str(self.binary))
        self.assertEqual(e.exception.kind, "GUEST_VERSION")
        self.assertFalse(self.cache().exists())

    def test_a_version_that_does_not_answer_is_guest_failed_not_guest_version(self):
        # GUEST_VERSION is final for a machine (a rebuild is removed on it); a timeout is not.
        timeout = subprocess.TimeoutExpired([str(self.binary), "--version"], 60)
        with mock.patch.object(opencode.subprocess, "run", side_effect=timeout):
            with self.assertRaises(Fail) as e:
                opencode.opencode_version(str(self.binary))
        self.assertEqual(e.exception.kind, "GUEST_FAILED")
        self.assertFalse(self.cache().exists())

    def test_a_fork_that_fails_or_a_killed_version_is_guest_failed_a_missing_binary_guest_version(self):
        for effect, kind in [
            (OSError(errno.EAGAIN, "Resource temporarily unavailable"), "GUEST_FAILED"),
            (OSError(errno.ETXTBSY, "Text file busy"), "GUEST_FAILED"),
            (subprocess.CompletedProcess([], -9, b"", b""), "GUEST_FAILED"),
            (OSError(errno.ENOENT, "No such file or directory"), "GUEST_VERSION"),
            (OSError(errno.EACCES, "Permission denied"), "GUEST_VERSION"),
        ]:
            run = {"side_effect": effect} if isinstance(effect, OSError) else {"return_value": effect}
            with mock.patch.object(opencode.subprocess, "run", **run):
                with self.assertRaises(Fail) as e:
                    opencode.opencode_version(str(self.binary))
            self.assertEqual(e.exception.kind, kind, effect)
        self.assertFalse(self.cache().exists())


if __name__ == "__main__":
    unittest.main()
