"""DBBench items: loading, their tables, and the prompt shown to the agent."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

MODIFYING_TYPES = ("INSERT", "UPDATE", "DELETE")

SYSTEM_PROMPT = """\
I will ask you a question; help me answer it by operating a MySQL database with SQL.
Explain the problem and your solution, writing down your thoughts.
In every round, after thinking, either operate on the database or answer, with the two tools provided.
To run SQL, call `execute_sql`; the SQL must be a single statement on one line. I will run it and give you the output, \
which is the raw MySQL result; interpret it yourself.
When you are done, call `commit_final_answer` with your answer. Call it only when you are sure: the answer must be \
exactly the correct one.
If the question asks you to modify the database, commit after the modification; the answer itself can then be anything.
Always use the tools; an answer written in the message content is not read."""


@dataclass(frozen=True)
class Table:
    """One table of an item; every value is stored as text, as upstream does."""

    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def load_items(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Read DBBench items from a ``.jsonl`` (one object a line) or ``.json`` (a list) file.

    Args:
        path: The data file; the vendored AgentBench dev split by default.
    """
    if path is None:
        text = resources.files("env_adapters").joinpath("data/agentbench/dbbench/dev.jsonl").read_text("utf-8")
        suffix = ".jsonl"
    else:
        text, suffix = Path(path).read_text("utf-8"), Path(path).suffix
    if suffix == ".json":
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def tables_of(item: dict[str, Any]) -> list[Table]:
    """The tables of an item (``table`` is one table or a list of them)."""
    raw = item["table"] if isinstance(item["table"], list) else [item["table"]]
    return [
        Table(
            name=t["table_name"],
            columns=tuple(c["name"] for c in t["table_info"]["columns"]),
            # str() of every value, None included, as upstream inserts them; the answer hashes depend on it.
            rows=tuple(tuple(str(v) for v in row) for row in t["table_info"]["rows"]),
        )
        for t in raw
    ]


def is_hash_scored(item: dict[str, Any]) -> bool:
    """Whether the item modifies the tables and is scored by the table hash (``answer_md5``)."""
    return item["type"][0] in MODIFYING_TYPES


def mysql_loadable(item: dict[str, Any]) -> bool:
    """Whether MySQL can create the item's tables (it rejects empty column names, which one dev item has)."""
    return all(column for table in tables_of(item) for column in table.columns)


def validate_item(item: Any) -> dict[str, Any]:
    """Check that a (custom) item has what a session needs.

    Raises:
        ValueError: naming the missing or malformed field.
    """
    if not isinstance(item, dict):
        raise ValueError(f"a DBBench item must be a JSON object, got {type(item).__name__}")
    for key in ("description", "table", "type"):
        if key not in item:
            raise ValueError(f"DBBench item lacks {key!r}; see env_adapters/data/agentbench/README.md for the format")
    try:
        tables_of(item)
    except (KeyError, TypeError) as e:
        raise ValueError(f"DBBench item has a malformed 'table' ({e!r}); expected {{table_name, table_info: "
                         "{columns: [{name}], rows: [[...]]}}") from e
    key = "answer_md5" if is_hash_scored(item) else "label"
    if key not in item:
        raise ValueError(f"DBBench item of type {item['type']} lacks {key!r}")
    return item


def user_prompt(item: dict[str, Any]) -> str:
    """The first user message: evidence and table description (when present), then the question."""
    parts = []
    if item.get("evidence"):
        parts.append(f"Evidence about the question: {item['evidence']}\n")
    if item.get("add_description"):
        parts.append(f"Additional table information about the question: {item['add_description']}\n")
    parts.append(f"Question: {item['description']}\n")
    return "".join(parts)
