"""The ALFWorld text engine: TextWorld's PDDL environment with ALFWorld's name demangler, one game per :class:`Game`.

TextWorld translates a game's PDDL to Fast Downward's SAS form twice on load and twice again on every reset, and parses
each of the grammar's ~700 production rules on load (most of their cost); the translation and the parse of a rule
are pure functions of the texts, so both are memoised per process (games differ in a few rules only; a generated
easy game's demonstration took 0.18 s of CPU instead of 0.47 s), as is the parse of the grammar's conditions, which
every step repeats for each admissible command. The second translation (optimised, about half of a game's load) only
feeds the planner, so it is made only for a game that asks for the planner's walkthrough.

Each TextWorld PDDL environment loads its own copy of the Fast Downward library (33 MB, never unloaded), so
environments are pooled and reused across games. TextWorld's PDDL translator keeps module-level state and every
reset and step parses text through one module-level grammar parser, so every engine call of a process holds one
lock, as upstream's worker does; blocking callers run in threads, and worker replicas scale the engine.
"""

from __future__ import annotations

import copy
import functools
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_LOCK = threading.Lock()
_IDLE: list[Any] = []  # PddlEnv instances between games
_planning = False  # whether the engine call in progress (under _LOCK) may run the planner


@functools.cache
def _memoise_translation() -> None:
    import fast_downward
    from textworld.envs.pddl import textgen
    from textworld.logic import Rule

    translate = functools.lru_cache(maxsize=256)(fast_downward.pddl2sas)

    def pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> tuple[Any, str]:
        if optimize and not _planning:
            return None, ""  # the planner's task: TextWorld reads it only to replan
        return translate(domain, problem, verbose=verbose, optimize=optimize)

    fast_downward.pddl2sas = pddl2sas
    # The parsed symbols are mutated when derived (contexts set, lists popped): each caller gets its own copy.
    parse = functools.lru_cache(maxsize=1 << 16)(textgen._parse_and_convert)
    textgen._parse_and_convert = lambda *args, **kwargs: copy.deepcopy(parse(*args, **kwargs))
    # A rule's condition, parsed again for every admissible command at every step; its callers only read it.
    Rule.parse_conjunctive_query = staticmethod(functools.lru_cache(maxsize=1 << 12)(Rule.parse_conjunctive_query))


@dataclass
class Observation:
    """What the engine says after a reset or a step."""

    text: str
    admissible_commands: list[str]
    won: bool
    done: bool


def load_game_file(path: str | Path) -> dict[str, Any]:
    """The content of a ``game.tw-pddl`` file, checked for the keys the engine needs.

    Raises:
        ValueError: the file is not a TextWorld PDDL game.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read ALFWorld game file {path}: {e}") from e
    missing = [k for k in ("pddl_domain", "grammar", "pddl_problem") if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"{path} is not a game.tw-pddl file: missing {missing}")
    return data


class Game:
    """One running ALFWorld game.

    Args:
        data: A ``game.tw-pddl`` file's content (``pddl_domain``, ``grammar``, ``pddl_problem``).
        walkthrough: Also compute the planner's walkthrough (the file's ``walkthrough`` if it has one) on reset.
    """

    def __init__(self, data: dict[str, Any], walkthrough: bool = False) -> None:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
        from textworld.envs.pddl import PddlEnv

        _memoise_translation()
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["walkthrough"] if walkthrough else [])
        self._planning = walkthrough and not data.get("walkthrough")
        with _LOCK:
            env = _IDLE.pop() if _IDLE else PddlEnv()
            env.request_infos = infos
            self._env = AlfredDemangler(env, shuffle=False)
            try:
                self._call(self._env.load, data)
            except BaseException:
                _IDLE.append(env)
                raise
        self._pddl_env = env
        self.walkthrough: list[str] | None = None

    def _call(self, method: Any, *args: Any) -> Any:
        """``method(*args)`` of the engine (a load or a reset translates the game); the caller holds ``_LOCK``."""
        global _planning
        _planning = self._planning
        try:
            return method(*args)
        finally:
            _planning = False

    def reset(self) -> Observation:
        with _LOCK:
            state = self._call(self._env.reset)
        if "extra.walkthrough" in state:
            self.walkthrough = list(state["extra.walkthrough"])
        return Observation(state.feedback, list(state["admissible_commands"]), bool(state["won"]), False)

    def step(self, command: str) -> Observation:
        with _LOCK:
            state, _, done = self._env.step(command)
        return Observation(state.feedback, list(state["admissible_commands"]), bool(state["won"]), bool(done))

    def close(self) -> None:
        """Give the environment back to the pool (once)."""
        env, self._pddl_env = self._pddl_env, None
        if env is not None:
            with _LOCK:
                _IDLE.append(env)
