"""OS-interaction items: load the vendored AgentBench data and normalise its loose shapes into :class:`OSItem`.

The data allows several spellings (see ``env_adapters/data/agentbench/README.md``): a script is a string, a
``{"code": ...}`` or a ``{"file": ...}`` object (optionally with ``language``); ``create`` is a dict with an
optional ``local`` flavour and ``init`` script(s), and in one dev item a stray list, read as "no create";
``example`` is a script in ``evaluation`` (or, once, beside it). Files named by ``{"file": ...}`` resolve
against ``scripts/`` beside this module, where equivalents of the few upstream files the data needs live.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from env_adapters.tasks.os_interaction.scoring import COMPARATORS

SPLITS = ("dev", "train")
FLAVOURS = ("default", "packages", "ubuntu")


@dataclass(frozen=True)
class Script:
    """A script to run in the container."""

    code: str
    language: str = "bash"


@dataclass(frozen=True)
class Check:
    """One link of a check chain.

    ``kind`` is ``example`` (run the item's example script; its stdout becomes the next argument),
    ``compare`` (``name`` is a key of :data:`~.scoring.COMPARATORS`, applied to the answer and the previous output) or
    ``script`` (run ``script`` in the container with the answer as ``$1``; exit status 0 passes).
    """

    kind: str
    name: str = ""
    script: Script | None = None


@dataclass(frozen=True)
class OSItem:
    """One OS-interaction sample.

    Attributes:
        description: The task text shown to the agent.
        flavour: Image flavour (``default``, ``packages`` or ``ubuntu``).
        init: Scripts run in the fresh container before the agent starts.
        start: Shell command started in the background before the agent starts.
        match: Expected answer (exact match after stripping), or None when ``checks`` decide.
        checks: The check chain.
        example: Reference solution script (its stdout is the expected answer for ``example`` checks).
    """

    description: str
    flavour: str = "default"
    init: tuple[Script, ...] = ()
    start: str | None = None
    match: str | None = None
    checks: tuple[Check, ...] = ()
    example: Script | None = None


def _script(obj: Any, where: str) -> Script:
    if isinstance(obj, str):
        return Script(obj)
    if isinstance(obj, dict):
        language = obj.get("language", "bash")
        if "code" in obj:
            return Script(obj["code"], language)
        if "file" in obj:
            path = resources.files(__package__) / "scripts" / obj["file"]
            if not path.is_file():
                raise ValueError(f"{where}: script file {obj['file']!r} is not in {__package__}/scripts/")
            return Script(path.read_text(encoding="utf-8"), language)
    raise ValueError(f"{where}: a script must be a string, {{'code': ...}} or {{'file': ...}}, got {obj!r}")


def _check(obj: Any, where: str) -> Check:
    if obj is None:
        return Check("example")
    if isinstance(obj, dict) and obj.get("language") == "python" and "file" in obj:
        name = obj["file"].rsplit("/", 1)[-1].removesuffix(".py")
        if name not in COMPARATORS:
            raise ValueError(f"{where}: unknown checker {obj['file']!r}; supported: {sorted(COMPARATORS)}")
        return Check("compare", name=name)
    return Check("script", script=_script(obj, where))


def parse_item(raw: dict[str, Any], where: str = "item") -> OSItem:
    """Normalise one raw item. Raises ValueError naming ``where`` and the bad field."""
    create = raw.get("create")
    if not isinstance(create, dict):
        create = {}  # absent, or the stray list of one dev item: the default container, no init
    flavour = create.get("local") or "default"
    if flavour not in FLAVOURS:
        raise ValueError(f"{where}: unknown create.local flavour {flavour!r}; known: {FLAVOURS}")
    init = create.get("init")
    init_scripts = () if init is None else tuple(
        _script(s, f"{where}.create.init") for s in (init if isinstance(init, list) else [init])
    )
    start = raw.get("start")
    if start is not None:
        start = _script(start, f"{where}.start").code
    evaluation = raw.get("evaluation") or {}
    example = evaluation.get("example", raw.get("example"))
    example_script = None if example is None else _script(example, f"{where}.example")
    if "match" in evaluation:
        match = evaluation["match"]
        if not isinstance(match, str):
            raise ValueError(f"{where}: evaluation.match must be a string, got {match!r}")
        return OSItem(raw["description"], flavour, init_scripts, start, match=match, example=example_script)
    if "check" not in evaluation:
        raise ValueError(f"{where}: evaluation needs 'match' or 'check'")
    check = evaluation["check"]
    checks = tuple(_check(c, f"{where}.evaluation.check") for c in (check if isinstance(check, list) else [check]))
    if any(c.kind == "example" for c in checks) and example_script is None:
        raise ValueError(f"{where}: a null check needs evaluation.example")
    return OSItem(raw["description"], flavour, init_scripts, start, checks=checks, example=example_script)


def load_items(split: str) -> list[OSItem]:
    """All items of a vendored split (``dev`` or ``train``), in file order."""
    if split not in SPLITS:
        raise ValueError(f"unknown OS-interaction split {split!r}; known: {SPLITS}")
    path = resources.files("env_adapters") / "data" / "agentbench" / "os_interaction" / f"{split}.json"
    text = path.read_text(encoding="utf-8")
    return [parse_item(raw, f"os_interaction/{split}.json[{i}]") for i, raw in enumerate(json.loads(text))]
