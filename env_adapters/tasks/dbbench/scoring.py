"""DBBench scoring rules, as AgentBench applies them (pure functions, no database).

SELECT-like items compare the committed answers with the item's ``label``:

1. both sides become lists of strings: a string that is a Python list literal (``"[('a',), ('b',)]"``, the way
   query results are printed) is unpacked, one-element tuples are unwrapped, quotes around values dropped;
2. each value is normalised: ``None``/``null``/``nan``/``inf``/empty -> ``"0"``, a trailing ``%`` dropped,
   thousands separators removed;
3. one value against one value: equal as floats within 0.01 when both parse as floats, else as strings;
   several values: a multiset match with the same float tolerance when every value is numeric, else set equality.

INSERT/UPDATE/DELETE items compare a hash of the final table contents computed by the server
(:func:`table_hash_query`) with the item's ``answer_md5``.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from typing import Any

FLOAT_TOLERANCE = 1e-2
_ZERO_ALIASES = {"", "none", "null", "undefined", "nan", "inf", "infinity", "-inf", "-infinity"}


def normalize_value(value: Any) -> str:
    """Normalise one answer value to the string form that is compared."""
    if value is None:
        return "0"
    text = str(value).strip()
    if text.endswith("%"):
        # A percentage is compared by its number; upstream stops normalising here.
        return text[:-1].strip()
    if not (text.startswith("[") and text.endswith("]")):
        text = text.replace(",", "")
    return "0" if text.lower() in _ZERO_ALIASES else text


def _unwrap(item: Any) -> Any:
    return item[0] if isinstance(item, tuple) and len(item) == 1 else item


def answer_values(answer: Any) -> list[str]:
    """Turn a committed answer or a label (string, list, printed query result) into normalised values."""
    if answer is None:
        return ["0"]
    if isinstance(answer, str):
        text = answer.strip()
        if text.startswith("[") and text.endswith("]"):
            try:
                parsed = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                parsed = None
            if isinstance(parsed, list):
                answer = parsed
        if isinstance(answer, str):
            return [normalize_value(text.strip("'\""))]
    if not isinstance(answer, (list, tuple)):
        answer = [answer]
    return [normalize_value(str(_unwrap(item)).strip().strip("'\"")) for item in answer]


def _as_float(value: str) -> float | None:
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _float_equal(a: float, b: float) -> bool:
    return abs(a - b) <= FLOAT_TOLERANCE


def answers_match(answer: Any, label: Any) -> bool:
    """Whether a committed answer matches the label of a SELECT-like item."""
    got, want = answer_values(answer), answer_values(label)
    if len(got) == 1 and len(want) == 1:
        a, b = _as_float(got[0]), _as_float(want[0])
        if a is not None and b is not None:
            return _float_equal(a, b)
        return got[0] == want[0]
    got_f, want_f = [_as_float(v) for v in got], [_as_float(v) for v in want]
    if None not in got_f and None not in want_f:
        if len(got_f) != len(want_f):
            return False
        unmatched = list(want_f)
        for value in got_f:
            hit = next((i for i, w in enumerate(unmatched) if _float_equal(value, w)), None)
            if hit is None:
                return False
            unmatched.pop(hit)
        return True
    return set(got) == set(want)


def quote_identifier(name: str) -> str:
    """A backquoted MySQL identifier (backquotes inside doubled)."""
    return "`" + name.replace("`", "``") + "`"


def table_hash_query(table_name: str, columns: Sequence[str]) -> str:
    """The server-side query whose single value is the content hash of one table.

    Each row hashes to the first 5 hex digits of ``md5(concat_ws(',', columns...))``; the table hashes to the md5
    of the sorted row hashes joined with commas. Needs MySQL semantics (md5, concat_ws skipping NULLs,
    group_concat with ORDER BY).
    """
    cols = ", ".join(quote_identifier(c) for c in columns)
    return (f"SELECT md5(group_concat(rowhash ORDER BY rowhash)) AS hash FROM (SELECT substring(md5(concat_ws(',', "
            f"{cols})), 1, 5) AS rowhash FROM {quote_identifier(table_name)}) AS sub")


def combine_table_hashes(hashes: Sequence[str | None]) -> str:
    """One hash for several tables: the sorted per-table hashes joined with ``_`` (empty tables hash to "None")."""
    return "_".join(sorted(str(h) for h in hashes))


def expected_hash(answer_md5: str) -> str:
    """The hash inside an item's ``answer_md5`` (printed as ``[('<hash>',)]``, or a bare hash).

    Raises:
        ValueError: the value is neither form.
    """
    text = answer_md5.strip()
    if not text.startswith("["):
        return text
    rows = ast.literal_eval(text)
    if not (isinstance(rows, list) and rows and isinstance(rows[0], tuple) and rows[0]):
        raise ValueError(f"answer_md5 {answer_md5!r} is not of the form [('<hash>',)]")
    return str(rows[0][0])
