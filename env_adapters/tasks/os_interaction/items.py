"""OS-interaction items: load upstream-format AgentBench data and normalise its loose shapes into :class:`OSItem`.

Data is read the way upstream reads it: a ``.json`` file (a list of items or one item), a ``.jsonl`` file (one
item a line) or a folder of such files (in name order), plus a scripts folder against which ``{"file": ...}``
references resolve. A script is a string, a ``{"code": ...}`` or a ``{"file": ...}`` object (optionally with
``language``); ``create`` is a dict with an optional ``local`` flavour (or upstream's older ``image`` name) and
``init`` script(s), and in one vendored dev item a stray list, read as "no create"; ``example`` is a script in
``evaluation`` (or, once, beside it). The vendored dev and train splits are the default data; their scripts
folder is ``scripts/`` beside this module (equivalents of the upstream files they name).
"""

from __future__ import annotations

import glob
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

SPLITS = ("dev", "train")
# The scripts folder of the vendored splits.
VENDORED_SCRIPTS = Path(__file__).parent / "scripts"
FLAVOURS = ("default", "packages", "ubuntu")
LANGUAGES = ("bash", "python")


@dataclass(frozen=True)
class Script:
    """A script to run in the container."""

    code: str
    language: str = "bash"


@dataclass(frozen=True)
class OSItem:
    """One OS-interaction sample.

    Attributes:
        description: The task text shown to the agent.
        flavour: Image flavour (``default``, ``packages`` or ``ubuntu``).
        init: Scripts run, each in a fresh process of the container, after the agent's shell has started.
        start: Shell text run in the agent's own shell before the agent's first command.
        match: Expected answer: the answer (stripped when ``strip``) must equal it; None when ``regex`` or
            ``checks`` decide.
        regex: A pattern the answer (stripped when ``strip``) must contain (``re.search``).
        strip: Strip the answer before ``match``/``regex`` (upstream: always for a plain-string match).
        checks: The check chain: each link runs with the answer and the outputs of the links before it as
            arguments and passes with exit status 0; None stands for the ``example`` script.
        example: Reference solution script.
    """

    description: str
    flavour: str = "default"
    init: tuple[Script, ...] = ()
    start: str | None = None
    match: str | None = None
    regex: str | None = None
    strip: bool = True
    checks: tuple[Script | None, ...] = ()
    example: Script | None = None


def _script(obj: Any, where: str, scripts: Path | None) -> Script:
    if isinstance(obj, str):
        return Script(obj)
    if isinstance(obj, dict):
        language = obj.get("language", "bash")
        if language not in LANGUAGES:
            raise ValueError(f"{where}: unsupported script language {language!r}; supported: {LANGUAGES}")
        if "code" in obj:
            return Script(obj["code"], language)
        if "file" in obj:
            if scripts is None:
                raise ValueError(f"{where}: names script file {obj['file']!r} but no scripts folder was given")
            path = scripts / obj["file"]
            if not path.is_file():
                raise ValueError(f"{where}: script file {obj['file']!r} does not exist (looked for {path})")
            return Script(path.read_text(encoding="utf-8"), language)
    raise ValueError(f"{where}: a script must be a string, {{'code': ...}} or {{'file': ...}}, got {obj!r}")


def _flavour(create: dict[str, Any], where: str) -> str:
    # `local` in the function-calling edition; older upstream data names the image (`local-os/default`).
    flavour = create.get("local") or str(create.get("image") or "default").rsplit("/", 1)[-1]
    if flavour not in FLAVOURS:
        raise ValueError(f"{where}: unknown image flavour {flavour!r}; known: {FLAVOURS}")
    return flavour


def parse_item(raw: dict[str, Any], where: str = "item", scripts: Path | None = None) -> OSItem:
    """Normalise one raw item; ``{"file": ...}`` references resolve against ``scripts``.

    Raises:
        ValueError: naming ``where`` and the bad field (or the missing script file).
    """
    if not isinstance(raw, dict) or not isinstance(raw.get("description"), str):
        raise ValueError(f"{where}: an item must be an object with a 'description' string")
    create = raw.get("create")
    if not isinstance(create, dict):
        create = {}  # absent, or the stray list of one dev item: the default container, no init
    flavour = _flavour(create, where)
    init = create.get("init")
    init_scripts = () if init is None else tuple(
        _script(s, f"{where}.create.init", scripts) for s in (init if isinstance(init, list) else [init])
    )
    start = raw.get("start")
    if start is not None:
        start = _script(start, f"{where}.start", scripts).code
    evaluation = raw.get("evaluation") or {}
    example = evaluation.get("example", raw.get("example"))
    example_script = None if example is None else _script(example, f"{where}.example", scripts)
    if "match" in evaluation:
        match = evaluation["match"]
        if isinstance(match, str):
            match = {"answer": match, "strip": True}
        if not (isinstance(match, dict) and isinstance(match.get("answer", match.get("regex")), str)):
            raise ValueError(f"{where}: evaluation.match must be a string or {{'answer'|'regex': str, 'strip': "
                             f"bool}}, got {match!r}")
        return OSItem(raw["description"], flavour, init_scripts, start, match=match.get("answer"),
                      regex=None if "answer" in match else match["regex"], strip=bool(match.get("strip", False)),
                      example=example_script)
    if "check" not in evaluation:
        raise ValueError(f"{where}: evaluation needs 'match' or 'check'")
    check = evaluation["check"]
    checks = tuple(None if c is None else _script(c, f"{where}.evaluation.check", scripts)
                   for c in (check if isinstance(check, list) else [check]))
    if None in checks and example_script is None:
        raise ValueError(f"{where}: a null check needs evaluation.example")
    return OSItem(raw["description"], flavour, init_scripts, start, checks=checks, example=example_script)


def _raw_items(path: Path) -> list[Any]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    return data if isinstance(data, list) else [data]


def load_items(data: str | Path, scripts: str | Path | None = None) -> list[OSItem]:
    """All items of upstream-format ``data``, in order.

    Args:
        data: A ``.json`` or ``.jsonl`` file, or a folder whose ``*.json`` and ``*.jsonl`` files are read in
            name order.
        scripts: Folder that ``{"file": ...}`` references are relative to (upstream's ``script_dir``); default:
            the folder holding the data file (or the data folder itself).

    Raises:
        ValueError: ``data`` holds no data file, or an item is malformed or names a missing script file.
    """
    data = Path(data)
    if data.is_dir():
        files = sorted(p for p in data.iterdir() if p.suffix in (".json", ".jsonl") and p.is_file())
    elif data.is_file() and data.suffix in (".json", ".jsonl"):
        files = [data]
    else:
        raise ValueError(f"OS-interaction data {str(data)!r} is neither a .json/.jsonl file nor a folder")
    if not files:
        raise ValueError(f"OS-interaction data folder {str(data)!r} holds no .json or .jsonl file")
    root = scripts_folder(data, scripts)
    return [parse_item(raw, f"{path.name}[{i}]", root) for path in files for i, raw in enumerate(_raw_items(path))]


def load_sources(files: Sequence[Mapping[str, str]]) -> list[OSItem]:
    """All items of upstream's ``data_config.files`` list, in order: each entry's ``problem_file`` (a path or a glob,
    its files in name order) with its scripts in ``script_dir`` (default: the folder of its files).

    Raises:
        ValueError: an entry is not ``{problem_file, script_dir}``, its ``problem_file`` matches no file, or an item
            is malformed.
    """
    if not files:
        raise ValueError("OS-interaction data: the list of {problem_file, script_dir} entries is empty")
    items: list[OSItem] = []
    for n, entry in enumerate(files):
        if not isinstance(entry, Mapping) or "problem_file" not in entry or set(entry) - {"problem_file", "script_dir"}:
            raise ValueError(f"OS-interaction data entry {n}: {entry!r} is not {{problem_file: PATH_OR_GLOB, "
                             "script_dir: FOLDER}")
        paths = sorted(Path(p) for p in glob.glob(str(entry["problem_file"])))
        if not paths:
            raise ValueError(f"OS-interaction data entry {n}: {entry['problem_file']!r} matches no file")
        root = scripts_folder(paths[0], entry.get("script_dir"))
        items += [item for path in paths for item in load_items(path, root)]
    return items


def scripts_folder(data: str | Path, scripts: str | Path | None = None) -> Path:
    """The folder ``data``'s script references resolve against: ``scripts``, else the folder of ``data``."""
    data = Path(data)
    root = Path(scripts) if scripts is not None else (data if data.is_dir() else data.parent)
    if not root.is_dir():
        raise ValueError(f"OS-interaction scripts folder {str(root)!r} does not exist")
    return root


def load_split(split: str) -> list[OSItem]:
    """All items of a vendored split (``dev`` or ``train``), in file order."""
    if split not in SPLITS:
        raise ValueError(f"unknown OS-interaction split {split!r}; known: {SPLITS}")
    data = resources.files("env_adapters") / "data" / "agentbench" / "os_interaction" / f"{split}.json"
    with resources.as_file(data) as path:
        return load_items(path, VENDORED_SCRIPTS)
