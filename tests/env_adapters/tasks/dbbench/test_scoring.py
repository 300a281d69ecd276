"""DBBench scoring rules (pure functions)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from env_adapters.tasks.dbbench.scoring import (
    answer_values,
    answers_match,
    combine_table_hashes,
    expected_hash,
    normalize_value,
    table_hash_query,
)


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [(None, "0"), ("NULL", "0"), ("nan", "0"), ("-Infinity", "0"), ("", "0"), ("55%", "55"), ("1,234,567", "1234567"),
     ("  Giza ", "Giza"), ("[1,2]", "[1,2]")],
)
def test_normalize_value(raw, normalized):
    assert normalize_value(raw) == normalized


def test_answer_values_unpacks_printed_query_results():
    assert answer_values("[('a',), ('b',)]") == ["a", "b"]
    assert answer_values([("7",), "8"]) == ["7", "8"]
    assert answer_values("'quoted'") == ["quoted"]
    assert answer_values("[not a literal") == ["[not a literal"]


@pytest.mark.parametrize(
    ("answer", "label", "match"),
    [
        (["21,000"], ["21000.0"], True),  # thousands separator, then float comparison
        (["2"], ["2.0"], True),
        (["2.004"], ["2"], True),  # within the 0.01 tolerance
        (["2.02"], ["2"], False),
        (["None"], ["none"], True),  # both are "no value"
        (["Giza"], ["giza"], False),  # strings are case-sensitive, as upstream
        (["2", "1"], ["1.0", "2.0"], True),  # multiset of floats, any order
        (["1", "1"], ["1", "2"], False),
        (["1", "2", "3"], ["1", "2"], False),
        (["b", "a", "a"], ["a", "b"], True),  # non-numeric: sets
        ("[('1–0',), ('2–0',)]", ["1–0", "2–0"], True),
        ([], ["none"], False),
    ],
)
def test_answers_match(answer, label, match):
    assert answers_match(answer, label) is match


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=2, max_size=6), st.randoms())
def test_numeric_answers_match_in_any_order(values, rng):
    shuffled = [f"{v!r}" for v in values]
    rng.shuffle(shuffled)
    assert answers_match(shuffled, [str(v) for v in values])


def test_hash_query_quotes_identifiers():
    query = table_hash_query("Win `%` table", ["a", "b`c"])
    assert "concat_ws(',', `a`, `b``c`)" in query
    assert "FROM `Win ``%`` table`" in query


def test_expected_hash_and_combination():
    assert expected_hash("[('09aa8fbf72f39362970f95a1276b957c',)]") == "09aa8fbf72f39362970f95a1276b957c"
    assert expected_hash("abc") == "abc"
    with pytest.raises(ValueError, match="answer_md5"):
        expected_hash("[]")
    assert combine_table_hashes(["b", "a"]) == "a_b"
    assert combine_table_hashes([None]) == "None"
