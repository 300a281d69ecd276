"""The answer comparators of the OS-interaction check chains (upstream ``check/*.py``), as pure functions.

Each takes the agent's answer and the reference output (the example script's stdout) and says whether they
agree. Unparseable input is a mismatch, never an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_SIZE_UNITS = {"B": 0, "BYTE": 0, "K": 1, "KB": 1, "M": 2, "MB": 2, "G": 3, "GB": 3, "T": 4, "TB": 4, "P": 5, "PB": 5}
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)")


def _norm(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n").strip()


def integer_match(answer: str, expected: str) -> bool:
    """Both parse as integers (surrounding whitespace allowed) and are equal."""
    try:
        return int(answer.strip()) == int(expected.strip())
    except ValueError:
        return False


def string_match(answer: str, expected: str) -> bool:
    """Equal after normalising line ends and stripping."""
    return _norm(answer) == _norm(expected)


def parse_size(text: str) -> float | None:
    """Bytes in a size like ``12K``, ``3.5 MB``, ``100``, ``7Byte`` (powers of 1024); None if unparseable."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        return None
    number, unit = m.groups()
    exponent = _SIZE_UNITS.get(unit.upper()) if unit else 0
    return None if exponent is None else float(number) * 1024**exponent


def size_match(answer: str, expected: str) -> bool:
    """Equal as byte counts (``4.0K`` == ``4096``)."""
    a, b = parse_size(answer), parse_size(expected)
    return a is not None and a == b


def containing(answer: str, expected: str) -> bool:
    """The expected text occurs in the answer."""
    return _norm(expected) in _norm(answer)


def within(answer: str, expected: str) -> bool:
    """The answer occurs in the expected text (upstream ``in``)."""
    return _norm(answer) in _norm(expected)


COMPARATORS: dict[str, Callable[[str, str], bool]] = {
    "integer-match": integer_match,
    "string-match": string_match,
    "size-match": size_match,
    "containing": containing,
    "in": within,
}
