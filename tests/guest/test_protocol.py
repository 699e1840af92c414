"""The guest helper's side of protocol.json, checked without a machine or OpenCode: the
error kinds it can emit are exactly the protocol's (the component's unit tests check the
protocol's against its codes), and its limits are the protocol's.

    python3 -m unittest discover -s tests/guest -p test_protocol.py -v
"""

import ast
import json
import sys
import unittest
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "component" / "guest"
PROTOCOL = json.loads((SOURCE / "protocol.json").read_text())

# Imported in-process from the source folder; no bytecode, so the folder that build.rs
# watches stays unchanged.
sys.dont_write_bytecode = True
sys.path.insert(0, str(SOURCE))
from boxd_helper import protocol, state  # noqa: E402

# The calls whose string arguments are error kinds: Fail(kind, …), failure(kind, …) and
# check_target(work, parts, kind), which raises Fail(kind, …) for its caller.
KIND_CALLS = {"Fail", "failure", "check_target"}


def kinds_in_source():
    """{kind: [module:line, …]} for every literal kind the package passes to KIND_CALLS."""
    found = {}
    for path in sorted((SOURCE / "boxd_helper").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in KIND_CALLS:
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.isupper():
                        found.setdefault(arg.value, []).append("%s:%d" % (path.name, node.lineno))
    return found


class ErrorKinds(unittest.TestCase):
    def test_the_helper_emits_exactly_the_protocols_error_kinds(self):
        emitted = kinds_in_source()
        self.assertEqual(sorted(emitted), sorted(PROTOCOL["errorKinds"]),
                         "emitted where: %s" % json.dumps(emitted, indent=1))

    def test_every_fail_passes_a_literal_kind_or_its_callers(self):
        # A kind held in a variable would escape the scan above; only check_target forwards one.
        for path in sorted((SOURCE / "boxd_helper").glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("Fail", "failure") and node.args:
                    first = node.args[0]
                    literal = isinstance(first, ast.Constant)
                    forwarded = isinstance(first, ast.Name) and first.id == "kind" and path.name in ("files.py", "protocol.py")
                    forwarded = forwarded or (isinstance(first, ast.Attribute) and first.attr == "kind" and path.name == "cli.py")
                    self.assertTrue(literal or forwarded, "%s:%d passes a kind that is not a literal" % (path.name, node.lineno))

    def test_a_kind_outside_the_protocol_cannot_leave_the_helper(self):
        with self.assertRaisesRegex(ValueError, "HOST_FAILED"):
            protocol.Fail("HOST_FAILED", "a laptop's code")
        with self.assertRaisesRegex(ValueError, "GUEST_RUN_FAILED"):
            protocol.failure("GUEST_RUN_FAILED", "a kind the component makes, not the helper")
        self.assertEqual(protocol.failure("PATH_REFUSED", "no", {"path": "x"}),
                         {"ok": False, "error": "PATH_REFUSED", "message": "no", "path": "x"})


class Limits(unittest.TestCase):
    def test_limits_come_from_the_protocol_file(self):
        limits = {k: v["max"] for k, v in PROTOCOL["limits"].items()}
        self.assertEqual((protocol.PROMPT_MAX, protocol.FILE_MAX, protocol.CALL_MAX, protocol.LIST_MAX, protocol.LAST_TEXT_MAX),
                         (limits["prompt"], limits["file"], limits["call"], limits["listing"], limits["lastText"]))
        self.assertEqual((limits["prompt"], limits["lastText"]), (4 << 20, 300), "what the manifest and docs promise")

    def test_last_text_is_cut_to_whole_words_within_the_limit(self):
        self.assertEqual(state.cut_text("short", 300), "short")
        words = "word " * 100
        cut = state.cut_text(words, 300)
        self.assertEqual(cut, ("word " * 60).rstrip())
        split = "a" * 298 + " secretsecret"
        self.assertEqual(state.cut_text(split, 300), "a" * 298, "a word the cut would split is left out")
        self.assertEqual(len(state.cut_text("é" * 400, 300)), 300, "characters, not bytes")
        self.assertEqual(state.cut_text("x" * 400, 300), "x" * 300, "one long word is still cut")

    def test_the_work_id_rule_is_the_protocols(self):
        rule = PROTOCOL["workId"]
        self.assertEqual(protocol.WORK_RE.pattern, rule["pattern"])
        self.assertEqual(state.Work("a" * rule["maxLength"]).id, "a" * rule["maxLength"])
        for bad in ("a" * (rule["maxLength"] + 1), "", "a-", "-a", "1a", "A", "a_b", "a.b"):
            with self.assertRaises(protocol.Fail) as caught:
                state.Work(bad)
            self.assertEqual(caught.exception.kind, "NAME_INVALID", bad)


if __name__ == "__main__":
    unittest.main()
