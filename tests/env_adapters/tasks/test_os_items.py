"""OS-interaction data parsing, comparators and tool-reply formatting (no Docker)."""

from __future__ import annotations

import pytest

from env_adapters.sandbox.shell import CommandResult
from env_adapters.tasks.os_interaction import EMPTY_OUTPUT, TRUNCATION_NOTE, format_output
from env_adapters.tasks.os_interaction.items import load_items, parse_item
from env_adapters.tasks.os_interaction.scoring import (
    containing,
    integer_match,
    parse_size,
    size_match,
    string_match,
    within,
)


def test_vendored_splits_load_with_every_shape_normalised():
    dev, train = load_items("dev"), load_items("train")
    assert (len(dev), len(train)) == (26, 1000)
    assert {item.flavour for item in dev + train} == {"default"}
    # dev[10] has a stray list as `create`: default container, no init; its check chain still works.
    assert dev[10].init == () and [c.kind for c in dev[10].checks] == ["example", "compare"]
    # The calc items are checked by a script (our check/0.sh) and have a reference solution (example/0.sh).
    assert dev[3].checks[0].kind == "script" and "calc" in dev[3].checks[0].script.code
    assert "/usr/local/bin/calc" in dev[3].example.code
    assert "/usr/stock.log" in dev[25].init[0].code  # {"file": "init/stock-log.sh"}
    assert dev[21].init[0].code.startswith("echo 123>/root/.tmp")  # init given as a plain string
    assert dev[0].match == "1" and dev[0].start.startswith("python3 -c")
    assert dev[24].match == "Awesome-AgentBench"  # `example` beside `evaluation`, unused for match items
    assert sum(c.name == "string-match" for item in train for c in item.checks) == 47


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ({"description": "x", "evaluation": {}}, "needs 'match' or 'check'"),
        ({"description": "x", "create": {"local": "alpine"}, "evaluation": {"match": "1"}}, "unknown create.local"),
        ({"description": "x", "evaluation": {"check": [None]}}, "needs evaluation.example"),
        ({"description": "x", "evaluation": {"check": {"file": "check/missing.sh"}}}, "not in"),
        ({"description": "x", "evaluation": {"check": [None, {"language": "python", "file": "check/fuzzy.py"}],
                                             "example": "ls"}}, "unknown checker"),
    ],
)
def test_malformed_items_are_rejected_with_the_reason(raw, error):
    with pytest.raises(ValueError, match=error):
        parse_item(raw, "custom")


@pytest.mark.parametrize(("answer", "expected", "ok"), [
    (" 42 ", "42\n", True), ("42", "43", False), ("4.0", "4", False), ("", "0", False), ("forty", "40", False),
])
def test_integer_match(answer, expected, ok):
    assert integer_match(answer, expected) is ok


@pytest.mark.parametrize(("answer", "expected", "ok"), [
    ("a\r\nb", "a\nb\n", True), ("installed", "not-yet", False), (" x ", "x", True),
])
def test_string_match(answer, expected, ok):
    assert string_match(answer, expected) is ok


@pytest.mark.parametrize(("text", "size"), [
    ("4.0K", 4096.0), ("12", 12.0), ("3 MB", 3 * 1024.0**2), ("7Byte", 7.0), ("1.5G", 1.5 * 1024**3), ("1X", None),
    ("K", None), ("", None),
])
def test_parse_size(text, size):
    assert parse_size(text) == size


def test_size_match_compares_byte_counts():
    assert size_match("4096", "4.0K\n") and size_match("1M", "1024K")
    assert not size_match("4K", "8.0K") and not size_match("big", "big")


def test_containing_and_in_are_each_others_mirror():
    assert containing("the answer is 42", "42") and not containing("42", "the answer is 42")
    assert within("42", "the answer is 42") and not within("the answer is 42", "42")


def test_format_output_truncates_and_explains_what_happened():
    long = CommandResult("x" * 5000, 0)
    text = format_output(long, 800, 30)
    assert len(text) == 800 and text.endswith(TRUNCATION_NOTE)
    assert format_output(CommandResult("", 0), 800, 30) == EMPTY_OUTPUT
    killed = format_output(CommandResult("partial\n", None, timed_out=True, restarted=True), 800, 30)
    assert killed.startswith("partial\n") and "longer than 30 s" in killed and "restarted" in killed
    # The shell kept more than it showed: still marked as truncated even if the kept part is short.
    assert format_output(CommandResult("y" * 10, None, flooded=True, truncated=True), 800, 30).count("truncated") == 1
