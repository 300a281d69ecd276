"""``alfworld``: AgentBench's ALFWorld task (function-calling edition) on the real TextWorld engine.

Upstream semantics (THUDM/AgentBench ``src/server/tasks/alfworld``): a system message with the instruction, a user
message with the room, the goal and the admissible commands; one tool ``take_action{action}``; per assistant
message (a *round*, at most ``max_step``):

- no tool call: a user message asks for one and the status becomes ``agent validation failed``;
- a call whose arguments cannot be read (not a JSON string, as an object is not either; no value; a value that is
  not text): a user message says so and the status becomes ``agent invalid action``;
- otherwise the first argument of the first call goes through upstream's ``process_action`` to the engine, whose
  observation (an invalid command gets "Nothing happens.") and the new admissible commands come back as the tool's
  reply. The same raw action three times in a row (after more than three rounds) ends the episode as ``agent
  invalid action``; a won game ends it with reward 1 and the status so far (``completed`` unless an earlier round
  set another, as upstream); after ``max_step`` rounds it ends as ``task limit reached`` with reward 0.

Games come from :mod:`~env_adapters.tasks.alfworld.generator` (``games: generated``) or from upstream's game files
(``games: files``: ``data_path`` holds the ``json_2.1.1/...`` folders that ``index_file`` lists, by default the
AgentBench dev split).
"""

from __future__ import annotations

import json
from collections import deque
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from env_adapters.protocol import Index, Message, SampleStatus
from env_adapters.task import StepResult, SyncSession, Task, TaskError, register_task, run_blocking
from env_adapters.tasks.alfworld import agentbench
from env_adapters.tasks.alfworld.engine import Game, load_game_file
from env_adapters.tasks.alfworld.generator import SPLITS, TASK_TYPES, Difficulty, generate

DEFAULT_INDEX_FILE = "dev.json"


class ALFWorldSession(SyncSession):
    """One game, played through ``take_action`` (blocking: the worker runs it in its thread pool)."""

    def __init__(self, data: dict[str, Any], max_step: int, instruction: str = agentbench.INSTRUCTION) -> None:
        self.data, self.max_step, self.instruction = data, max_step, instruction
        self.game: Game | None = None
        self.rounds = 0
        self.status = SampleStatus.COMPLETED  # what a won game reports; invalid rounds change it, as upstream
        # The last raw actions, for the repeat check (only as many as it reads: a session's memory stays bounded
        # whatever its actions' size), and how many rounds were executed.
        self.recent: deque[str] = deque(maxlen=agentbench.REPEAT_LIMIT)
        self.executed = 0
        self.commands: list[str] = []

    def _result(self, messages: list[Message], status: SampleStatus = SampleStatus.RUNNING,
                reward: float = 0.0) -> StepResult:
        metrics = {"score": reward, "rounds": self.rounds, "executed": self.executed}
        return StepResult(messages, status, reward, metrics)

    def reset(self) -> StepResult:
        self.game = Game(self.data)
        first = self.game.reset()
        self.commands = first.admissible_commands
        messages = [{"role": "system", "content": self.instruction},
                    {"role": "user", "content": agentbench.task_prompt(first.text, self.commands)}]
        result = self._result(messages)
        result.tools = agentbench.TOOLS
        return result

    def step(self, message: Message) -> StepResult:
        self.rounds += 1
        reply = self._round(message)
        if isinstance(reply, StepResult):
            return reply
        if self.rounds >= self.max_step:
            return self._result([reply], SampleStatus.TASK_LIMIT_REACHED)
        return self._result([reply])

    def _round(self, message: Message) -> Message | StepResult:
        tool_calls = message.get("tool_calls") or []
        if not tool_calls:
            self.status = SampleStatus.AGENT_VALIDATION_FAILED
            return {"role": "user", "content": agentbench.NO_TOOL_CALL}
        try:  # upstream reads the first call this way; any failure is the agent's invalid call
            call = tool_calls[0]
            arguments = call["function"]["arguments"]
            output = list(json.loads(arguments).values())[0]  # arguments as an object: a TypeError, as upstream
            call_id = call["id"]
            action = agentbench.process_action(output, self.commands)
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            self.status = SampleStatus.AGENT_INVALID_ACTION
            return {"role": "user", "content": agentbench.INVALID_TOOL_CALL}
        observation = self.game.step(action)
        self.commands = observation.admissible_commands
        content = agentbench.process_ob(observation.text) + agentbench.available_actions(self.commands)
        reply = {"role": "tool", "tool_call_id": call_id, "content": content}
        self.recent.append(str(output)[:agentbench.MAX_ACTION_CHARS + 1])  # what the repeat check needs of it
        self.executed += 1
        if self.executed > agentbench.REPEAT_LIMIT and len(set(self.recent)) == 1:
            return self._result([reply], SampleStatus.AGENT_INVALID_ACTION)
        if observation.done:
            return self._result([reply], self.status, float(observation.won))
        return reply

    def close(self) -> None:
        if self.game is not None:
            self.game.close()


@register_task("alfworld")
class ALFWorldTask(Task):
    """Household games of ALFWorld's six task types, played with AgentBench's ``take_action`` tool.

    Args:
        games: ``generated`` (seeded games from the bundled floor plans) or ``files`` (upstream game files).
        seed: Seed of the generated games.
        split: ``train`` or ``test`` (held-out floor plans) for generated games.
        size: Number of generated games (indices ``0..size-1``).
        task_types: Task types of generated games (default all six; index ``i`` gets type ``i mod n``).
        max_receptacles: Most receptacles per generated room (``None``: the whole floor plan).
        distractors: Objects placed in a generated room besides those the task needs.
        data_path: For ``files``: the folder that holds upstream's ``json_2.1.1`` game folders.
        index_file: For ``files``: a JSON file ``{task type: [game.tw-pddl paths relative to data_path]}``
            (default: AgentBench's ALFWorld dev split, 20 games).
        max_step: Rounds per episode (upstream: 20).
        prompt: ``upstream`` (upstream's instruction) or ``short`` (one line, for tiny models).
    """

    def __init__(self, games: str = "generated", seed: int = 0, split: str = "train", size: int = 500,
                 task_types: list[str] | None = None, max_receptacles: int | None = None, distractors: int = 10,
                 data_path: str | None = None, index_file: str | None = None, max_step: int = 20,
                 prompt: str = "upstream") -> None:
        if games not in ("generated", "files"):
            raise ValueError(f"alfworld: games must be 'generated' or 'files', got {games!r}")
        if max_step < 1 or size < 1:
            raise ValueError(f"alfworld: max_step and size must be >= 1, got max_step={max_step}, size={size}")
        if split not in SPLITS:
            raise ValueError(f"alfworld: split must be one of {list(SPLITS)}, got {split!r}")
        if prompt not in agentbench.INSTRUCTIONS:
            raise ValueError(f"alfworld: prompt must be one of {sorted(agentbench.INSTRUCTIONS)}, got {prompt!r}")
        self.instruction = agentbench.INSTRUCTIONS[prompt]
        self.games, self.seed, self.split, self.size, self.max_step = games, int(seed), split, int(size), int(max_step)
        self.difficulty = Difficulty(tuple(task_types or TASK_TYPES), max_receptacles, int(distractors))
        self.files: list[Path] = []
        if games == "files":
            self.files = _game_files(data_path, index_file)
        self.game_data = lru_cache(maxsize=1024)(self._game_data)
        self._walkthroughs: dict[Index, list[str]] = {}

    def indices(self) -> list[Index]:
        return list(range(len(self.files) if self.games == "files" else self.size))

    def expert(self, index: Index, messages: list[Message]) -> Message:
        """The game's walkthrough (see the family's ``expert`` module and :meth:`walkthrough`)."""
        from env_adapters.tasks.alfworld.expert import expert

        return expert(self, index, messages)

    def _game_data(self, index: int) -> dict[str, Any]:
        """The ``game.tw-pddl`` content of ``index``."""
        if self.games == "files":
            return load_game_file(self.files[index])
        return generate(self.seed, self.split, index, self.difficulty)

    def _check(self, index: Index) -> int:
        if not isinstance(index, int) or not 0 <= index < len(self.indices()):
            raise TaskError(f"alfworld index must be in 0..{len(self.indices()) - 1}, got {index!r}")
        return index

    async def start_session(self, index: Index, custom_task: dict[str, Any] | None = None) -> ALFWorldSession:
        data = await run_blocking(self.game_data, self._check(index))
        return ALFWorldSession(data, self.max_step, self.instruction)

    def walkthrough(self, index: Index) -> list[str]:
        """The winning command sequence for ``index``: the game's own (generated games carry theirs), else the
        planner's (blocking: up to seconds of CPU; cached)."""
        data = self.game_data(self._check(index))
        if data.get("walkthrough"):
            return list(data["walkthrough"])
        if index not in self._walkthroughs:
            game = Game(data, walkthrough=True)
            try:
                game.reset()
            finally:
                game.close()
            if not game.walkthrough:
                raise TaskError(f"alfworld game {index} has no plan: the planner found it unsolvable")
            self._walkthroughs[index] = game.walkthrough
        return self._walkthroughs[index]


def _game_files(data_path: str | None, index_file: str | None) -> list[Path]:
    if not data_path:
        raise ValueError("alfworld: games=files needs data_path, the folder holding upstream's json_2.1.1 game "
                         "folders (see docs/environments/alfworld.md)")
    root = Path(data_path).expanduser()
    if index_file:
        listing = json.loads(Path(index_file).expanduser().read_text(encoding="utf-8"))
    else:
        resource = resources.files("env_adapters") / "data" / "agentbench" / "alfworld" / DEFAULT_INDEX_FILE
        listing = json.loads(resource.read_text(encoding="utf-8"))
    files = [root / path for paths in listing.values() for path in paths]  # upstream's order
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"alfworld: {len(missing)} of {len(files)} game files are missing under {root}, e.g. "
                         f"{missing[0]}; data_path must hold the json_2.1.1 folder")
    return files
