"""``webshop``: AgentBench's WebShop. The agent shops for a product matching an instruction in a searchable shop.

Protocol as AgentBench's ``src/server/tasks/webshop/task.py`` (function-calling version):

- opening: upstream's system prompt, then ``The initial observation:\\n<page>\\n\\nAvailable Actions:\\n<dict>``;
- tools ``search_action(keywords)`` and ``click_action(value)``; only the first call of a message is used, its
  first argument value whatever its name (as upstream);
- after an action: a ``tool`` message ``Action: search[...]\\n\\nObservation:\\n<page>\\n\\nAvailable Actions:\\n
  <dict>``; ``Buy Now`` ends the episode (``completed``) with upstream's reward and no further message;
- a message without tool calls does not end the episode: the next message is a ``user`` one whose observation
  is ``No executable tool calls found! You should call a tool instead.``; a call whose arguments cannot be read
  adds ``No valid tool call found from agent.``; a call of another tool changes nothing;
- after ``max_rounds`` (upstream's ``round``, 20) assistant messages without a purchase: ``task limit reached``,
  reward 0, with a last ``tool`` message ``Task limit reached.``.

Metrics: ``score`` (= reward), the reward's parts (``r_type``, ``r_att``, ``r_option``, ``r_price``, ``title_score``,
``query_match``, ``category_match``), ``rounds``, ``searches``, ``purchased_target``.

The catalogue (generated or upstream's files) and its BM25 index are built once when the task is constructed and
shared by all sessions; a session holds only its page state. The engine is synchronous (a search takes about a
millisecond), so sessions are :class:`~env_adapters.task.SyncSession` objects run in the worker's thread pool.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from env_adapters.protocol import Index, Message, SampleStatus
from env_adapters.task import StepResult, SyncSession, Task, TaskError, function_tool, register_task
from env_adapters.tasks.webshop.catalogue import Catalogue, Goal
from env_adapters.tasks.webshop.engine import PRODUCT_WINDOW, Page, Shop, WebShopEnv
from env_adapters.tasks.webshop.generator import PRESETS, GeneratorConfig, generate_catalogue, preset
from env_adapters.tasks.webshop.reward import TitleNouns

SYSTEM_PROMPT = """
You are web shopping.
I will give you instructions about what to do.
You have to follow the instructions.
Every round I will give you an observation and a list of available actions,
you have to respond with calling a tool provided based on the state and instruction.
You can use search tool if search is available.
You can click one of the buttons in clickables.
If the action is not valid, perform nothing.
Keywords in search are up to you, but the value in click must be a value in the list of available actions.
Remember that your keywords in search should be carefully designed.
Your should first think about what to do, then call a tool correspondingly.
You should always use a tool, even if you have questions to confirm. You can use whatever tool is available and \
do not need permission from the user.
"""
# One line for tiny models (option ``prompt: short``): upstream's rules cost ~200 tokens of every episode.
SHORT_PROMPT = "Shop for the instruction's product: search, then click values from the available actions."
PROMPTS = {"upstream": SYSTEM_PROMPT, "short": SHORT_PROMPT}

TOOLS = [
    function_tool("search_action", "Use search functionality with specified keywords.",
                  {"keywords": {"type": "string", "description": "The keywords to use in the search function."}}),
    function_tool("click_action", "Click a button or link with a specified value.",
                  {"value": {"type": "string",
                             "description": "The value to click from the list of available actions."}}),
]
for _tool in TOOLS:
    _tool["function"]["parameters"]["additionalProperties"] = False

NO_TOOL_CALL = "No executable tool calls found! You should call a tool instead."
INVALID_TOOL_CALL = "No valid tool call found from agent."
TASK_LIMIT = "Task limit reached."
MAX_ARGUMENT_CHARS = 1000
"""Longest search keywords or click value a call may carry. Upstream has no bound; its queries and values are tens of
characters, and a 3.9 MB search was held by the session and took 3.8 s to run."""
ARGUMENT_TOO_LONG = f"The keywords or value of a call may be at most {MAX_ARGUMENT_CHARS} characters; nothing was done."
ACTIONS = {"search_action": "search", "click_action": "click"}
REWARD_METRICS = ("r_type", "r_att", "r_option", "r_price", "title_score", "query_match", "category_match",
                  "nouns_by_spacy")


def read_action(message: Message) -> tuple[str | None, str | None]:
    """Upstream's reading of an assistant message: ``(action, call id)`` of its first tool call.

    ``action`` is ``search[<first argument>]`` or ``click[<first argument>]``, ``None`` for another tool. Arguments
    may be a JSON text (as upstream reads them) or an object.

    Raises:
        ValueError: the first call cannot be read (``tool_calls`` not a list of calls; no function name, arguments
            or id; arguments that are not a JSON object; a search or click without an argument; text that is not
            valid Unicode).
    """
    calls = message["tool_calls"]
    if not isinstance(calls, list) or not calls:
        raise ValueError(f"unreadable tool calls {calls!r}: not a list of calls")
    call = calls[0]
    try:
        function, call_id = call["function"], call["id"]
        name, arguments = function["name"], function["arguments"]
        values = list((json.loads(arguments) if isinstance(arguments, str) else arguments).values())
        if name not in ACTIONS:
            return None, call_id
        action = f"{ACTIONS[name]}[{values[0]}]"
        action.encode()  # a lone surrogate could not be shown back to the agent
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as e:
        raise ValueError(f"unreadable tool call {call!r}: {e}") from e
    return action, call_id


def _tool_message(call_id: str | None, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


class WebShopSession(SyncSession):
    """One shopping episode: a browser on the shared shop, driven by upstream's round loop."""

    def __init__(self, shop: Shop, goal: Goal, max_rounds: int, rng: random.Random, system_prompt: str = SYSTEM_PROMPT,
                 page_size: int = PRODUCT_WINDOW) -> None:
        self.env = WebShopEnv(shop, goal, rng, page_size=page_size)
        self.max_rounds, self.system_prompt = max_rounds, system_prompt
        self.rounds = 0
        self.observation = self.env.observation
        self.action: str | None = None
        self.call_id: str | None = None

    def _prompt(self, first: bool = False) -> Message:
        """The message that opens a round (upstream injects it at the top of its loop)."""
        page = f"{self.observation}\n\nAvailable Actions:\n{self.env.available_actions()}"
        if first:
            return {"role": "user", "content": f"The initial observation:\n{page}"}
        if self.action is None:
            return {"role": "user", "content": f"Observation:\n{page}"}
        return _tool_message(self.call_id, f"Action: {self.action}\n\nObservation:\n{page}")

    def metrics(self) -> dict[str, Any]:
        env = self.env
        metrics: dict[str, Any] = {"score": env.reward, "rounds": self.rounds, "searches": env.searches,
                                   "purchased_target": float(env.page is Page.DONE and env.asin == env.goal.asin)}
        metrics.update((k, float(env.reward_info[k])) for k in REWARD_METRICS if k in env.reward_info)
        return metrics

    def reset(self) -> StepResult:
        return StepResult(messages=[{"role": "system", "content": self.system_prompt}, self._prompt(first=True)],
                          tools=TOOLS, metrics=self.metrics())

    def step(self, message: Message) -> StepResult:
        self.rounds += 1
        messages: list[Message] = []
        self.action = None
        if not message.get("tool_calls"):
            self.observation = NO_TOOL_CALL
        else:
            try:
                self.action, self.call_id = read_action(message)
            except ValueError:
                messages.append({"role": "user", "content": INVALID_TOOL_CALL})
            if self.action is not None and len(self.action.split("[", 1)[1]) - 1 > MAX_ARGUMENT_CHARS:
                self.action = None  # refused before the shop sees it: the session keeps nothing of it
                messages.append(_tool_message(self.call_id, ARGUMENT_TOO_LONG))
        if self.action is not None:
            self.observation, reward, done = self.env.step(self.action)
            if done:
                return StepResult(messages, SampleStatus.COMPLETED, reward, self.metrics())
        if self.rounds >= self.max_rounds:
            messages.append(_tool_message(self.call_id, TASK_LIMIT))
            return StepResult(messages, SampleStatus.TASK_LIMIT_REACHED, 0.0, self.metrics())
        messages.append(self._prompt())
        return StepResult(messages, SampleStatus.RUNNING, 0.0, self.metrics())


@register_task("webshop")
class WebShopTask(Task):
    """The WebShop task family.

    Args:
        catalogue: ``generated`` (default) or a directory holding upstream's ``items_shuffle.json``,
            ``items_ins_v2.json`` and ``items_human_ins.json``.
        preset: Generated catalogue: ``easy``, ``standard`` (default) or ``hard`` (see :data:`PRESETS`).
        generator: Generated catalogue: knobs overriding the preset's (``products``, ``goals``, ``held_out``,
            ``distractors``, ``goal_attributes``, ``goal_options``, ``types``).
        seed: Seed of the generated catalogue and of the price draws.
        num_products: Upstream files: read only the first N products (upstream's ``num_products``).
        start: First goal index served (upstream's ``start``).
        end: One past the last goal index served (upstream's ``end``); default all goals.
        max_rounds: Assistant messages per episode (upstream's ``round``: 20).
        prompt: ``upstream`` (upstream's system prompt) or ``short`` (one line, for tiny models).
        page_size: Products per results page (upstream: 10; fewer make shorter episodes).
        title_nouns: How the reward finds title nouns: ``auto`` (spaCy's ``en_core_web_lg`` or ``en_core_web_sm``
            where installed, as upstream, else a rule; the metric ``nouns_by_spacy`` says which), ``rule``, or a
            spaCy pipeline's name or path.
    """

    def __init__(self, catalogue: str = "generated", preset: str = "standard", generator: dict[str, Any] | None = None,
                 seed: int = 0, num_products: int | None = None, start: int = 0, end: int | None = None,
                 max_rounds: int = 20, prompt: str = "upstream", page_size: int = PRODUCT_WINDOW,
                 title_nouns: str = "auto") -> None:
        if max_rounds < 1 or page_size < 1:
            raise ValueError(f"webshop task: max_rounds and page_size must be >= 1, got {max_rounds} and {page_size}")
        if prompt not in PROMPTS:
            raise ValueError(f"webshop task: prompt must be one of {sorted(PROMPTS)}, got {prompt!r}")
        self.seed, self.max_rounds = int(seed), int(max_rounds)
        self.system_prompt, self.page_size = PROMPTS[prompt], int(page_size)
        if catalogue == "generated":
            if num_products is not None:
                raise ValueError("webshop task: num_products applies to upstream's files; for the generated "
                                 "catalogue set generator: {products: N}")
            self.config = _generator_config(preset, generator or {})
            loaded = generate_catalogue(self.config, self.seed)
        else:
            if generator or preset != "standard":
                raise ValueError("webshop task: preset and generator apply to the generated catalogue, not to "
                                 f"the files in {catalogue!r}")
            if not Path(catalogue).is_dir():
                raise ValueError(f"webshop task: catalogue must be 'generated' or a directory with upstream's files, "
                                 f"got {catalogue!r}")
            self.config = None
            loaded = Catalogue.load(catalogue, seed=self.seed, num_products=num_products)
        end = len(loaded.goals) if end is None else end
        if not 0 <= start < end <= len(loaded.goals):
            raise ValueError(f"webshop task: need 0 <= start < end <= {len(loaded.goals)} (goals in the catalogue), "
                             f"got start={start}, end={end}")
        self.start, self.end = start, end
        self.shop = Shop(loaded, TitleNouns(title_nouns))
        self._sessions_started = 0

    def indices(self) -> list[Index]:
        return list(range(self.start, self.end))

    def expert(self, index: Index, messages: list[Message]) -> Message:
        """The scripted expert (see the family's ``expert`` module)."""
        from env_adapters.tasks.webshop.expert import expert

        return expert(self, index, messages)

    def goal(self, index: Index) -> Goal:
        """The goal of a served index."""
        if not isinstance(index, int) or not self.start <= index < self.end:
            raise TaskError(f"webshop task: index must be in {self.start}..{self.end - 1}, got {index!r}")
        return self.shop.catalogue.goals[index]

    async def start_session(self, index: Index, custom_task: dict[str, Any] | None = None) -> SyncSession:
        self._sessions_started += 1
        # <r> searches: reproducible per (seed, index, session number), independent across sessions.
        rng = random.Random(f"{self.seed}:{index}:{self._sessions_started}")
        return WebShopSession(self.shop, self.goal(index), self.max_rounds, rng, self.system_prompt, self.page_size)


def _generator_config(name: str, knobs: dict[str, Any]) -> GeneratorConfig:
    if name not in PRESETS:
        raise ValueError(f"webshop task: unknown preset {name!r}; known: {sorted(PRESETS)}")
    unknown = sorted(set(knobs) - set(GeneratorConfig.__dataclass_fields__))
    if unknown:
        raise ValueError(f"webshop task: unknown generator knob(s) {unknown}; known: "
                         f"{sorted(GeneratorConfig.__dataclass_fields__)}")
    return preset(name, **{k: int(v) for k, v in knobs.items()})
