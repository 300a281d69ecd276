"""``calc``: a two-step arithmetic task (call ``calculate``, then ``submit``) for tests, examples and the
training demo.

Index ``i`` maps to a deterministic problem drawn from ``random.Random(f"{seed}:{i}")``: a 2-digit addition or
subtraction asked in one of four phrasings, as a single user message. The episode ends on ``submit`` (reward 1.0
iff the answer is right *and* ``calculate`` was called before), on a message the agent cannot have meant (no
tool call, unknown tool, arguments that are not JSON: ``agent invalid action``), or after ``max_rounds``
assistant messages (``task limit reached``).
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from dataclasses import dataclass
from typing import Any

from env_adapters.protocol import Index, Message, SampleStatus
from env_adapters.task import (
    StepResult,
    Task,
    TaskError,
    ToolCall,
    ToolSession,
    assistant_tool_call,
    function_tool,
    register_task,
)

PHRASINGS = {
    "+": ("What is {a} plus {b}?", "Compute {a} + {b}.", "Add {a} and {b}.", "How much is {a} + {b}?"),
    "-": ("What is {a} minus {b}?", "Compute {a} - {b}.", "Subtract {b} from {a}.", "How much is {a} - {b}?"),
}

TOOLS = [
    function_tool(
        "calculate",
        "Evaluate an integer expression with + and -",
        {"expression": {"type": "string", "description": "e.g. 37+48"}},
    ),
    function_tool("submit", "Submit the final answer", {"answer": {"type": "string"}}),
]

_TOKEN = re.compile(r"\s*(?:(\d+)|([+-]))")
MAX_EXPRESSION_CHARS = 200


def evaluate(expression: str) -> int:
    """Evaluate an integer expression of ``+`` and ``-`` (unary signs allowed), without ``eval``.

    Raises:
        ValueError: anything else (other operators, letters, dangling signs, too long).
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    total, sign, expect_number, pos = 0, 1, True, 0
    text = expression.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"unexpected {text[pos:].strip()[:10]!r}; only integers, + and - are allowed")
        number, op = m.groups()
        if number is not None:
            if not expect_number:
                raise ValueError(f"missing operator before {number}")
            total += sign * int(number)
            sign, expect_number = 1, False
        else:
            # An operator after a number is binary; a sign before a number (also repeated) is unary.
            sign = (1 if op == "+" else -1) * (sign if expect_number else 1)
            expect_number = True
        pos = m.end()
    if expect_number:
        raise ValueError("expression is empty or ends with an operator")
    return total


@dataclass(frozen=True)
class Problem:
    a: int
    b: int
    op: str

    @property
    def result(self) -> int:
        return self.a + self.b if self.op == "+" else self.a - self.b

    @classmethod
    def from_index(cls, seed: int, index: int) -> tuple[Problem, str]:
        """The problem and its phrasing for ``index`` (deterministic in ``seed`` and ``index``)."""
        rng = random.Random(f"{seed}:{index}")
        problem = cls(rng.randint(10, 99), rng.randint(10, 99), rng.choice("+-"))
        return problem, rng.choice(PHRASINGS[problem.op]).format(a=problem.a, b=problem.b)


def step_latency_sampler(spec: dict[str, Any] | None, rng: random.Random):
    """A function returning the extra seconds to sleep per step, from a ``step_latency`` option.

    ``{dist: fixed, s: 0.1}`` or ``{dist: lognormal, median_s: 0.05, sigma: 1.5, max_s: 5}``; ``None``: no delay.
    """
    if not spec:
        return lambda: 0.0
    spec = dict(spec)
    dist = spec.pop("dist", None)
    try:
        if dist == "fixed":
            seconds = float(spec.pop("s"))
            sample = lambda: seconds  # noqa: E731
        elif dist == "lognormal":
            mu, sigma = math.log(float(spec.pop("median_s"))), float(spec.pop("sigma"))
            cap = float(spec.pop("max_s", math.inf))
            sample = lambda: min(rng.lognormvariate(mu, sigma), cap)  # noqa: E731
        else:
            raise ValueError(f"unknown dist {dist!r}; use 'fixed' or 'lognormal'")
    except (KeyError, ValueError) as e:
        raise ValueError(
            f"bad step_latency {dict(spec, dist=dist)}: {e}; expected {{dist: fixed, s: SECONDS}} or "
            "{dist: lognormal, median_s: S, sigma: X, max_s: S}"
        ) from e
    if spec:
        raise ValueError(f"step_latency has unknown keys {sorted(spec)}")
    return sample


class CalcSession(ToolSession):
    tools = TOOLS
    no_call_hint = "the message has no tool call; call calculate or submit"

    def __init__(self, problem: Problem, prompt: str, max_rounds: int, latency) -> None:
        self.problem, self.prompt, self.max_rounds, self.latency = problem, prompt, max_rounds, latency
        self.calculate_calls = 0

    def step_metrics(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "calculate_calls": self.calculate_calls}

    async def reset(self) -> StepResult:
        return StepResult(messages=[{"role": "user", "content": self.prompt}], tools=TOOLS,
                          metrics=self.step_metrics())

    async def step(self, message: Message) -> StepResult:
        delay = self.latency()
        if delay > 0:
            await asyncio.sleep(delay)
        return await super().step(message)

    async def tool_calculate(self, call: ToolCall) -> str:
        self.calculate_calls += 1
        try:
            return str(evaluate(str(call.arguments["expression"])))
        except ValueError as e:
            return f"error: {e}"

    async def tool_submit(self, call: ToolCall) -> StepResult:
        correct = str(call.arguments["answer"]).strip() == str(self.problem.result)
        reward = 1.0 if correct and self.calculate_calls > 0 else 0.0
        return StepResult([], SampleStatus.COMPLETED, reward, self.step_metrics())


@register_task("calc")
class CalculatorTask(Task):
    """Two-digit addition/subtraction solved with a ``calculate`` tool and a ``submit`` tool.

    Args:
        seed: Seed of the problem generator (and of ``step_latency``).
        size: Number of indices (``0..size-1``).
        max_rounds: Assistant messages allowed; the session ends with ``task limit reached`` after that many
            without a ``submit``.
        step_latency: Extra sleep per step, for asynchronous-training benchmarks (see
            :func:`step_latency_sampler`); default none.
    """

    def __init__(self, seed: int = 0, size: int = 1000, max_rounds: int = 4,
                 step_latency: dict[str, Any] | None = None) -> None:
        if size < 1 or max_rounds < 1:
            raise ValueError(f"calc: size and max_rounds must be >= 1, got size={size}, max_rounds={max_rounds}")
        self.seed, self.size, self.max_rounds = int(seed), int(size), int(max_rounds)
        self.step_latency = step_latency
        step_latency_sampler(step_latency, random.Random(0))  # validate now: fail at worker start, not per session
        self._sessions_started = 0

    def indices(self) -> list[Index]:
        return list(range(self.size))

    def expert(self, index: Index, messages: list[Message]) -> Message:
        """Call ``calculate`` on the problem, then ``submit`` the tool's result."""
        tool_replies = [m for m in messages if m["role"] == "tool"]
        if not tool_replies:
            problem, _ = Problem.from_index(self.seed, int(index))
            return assistant_tool_call("calculate", {"expression": f"{problem.a}{problem.op}{problem.b}"})
        return assistant_tool_call("submit", {"answer": tool_replies[-1]["content"].strip()})

    async def start_session(self, index: Index, custom_task: dict[str, Any] | None = None) -> CalcSession:
        if index == -1 and custom_task is not None:
            try:
                problem = Problem(int(custom_task["a"]), int(custom_task["b"]), str(custom_task.get("op", "+")))
            except (KeyError, TypeError, ValueError) as e:
                raise TaskError(
                    f"calc custom_task must be {{'a': int, 'b': int, 'op': '+'|'-'}}, got {custom_task}"
                ) from e
            if problem.op not in PHRASINGS:
                raise TaskError(f"calc custom_task op must be '+' or '-', got {problem.op!r}")
            prompt = PHRASINGS[problem.op][0].format(a=problem.a, b=problem.b)
        elif isinstance(index, int) and 0 <= index < self.size:
            problem, prompt = Problem.from_index(self.seed, index)
        else:
            raise TaskError(f"calc index must be in 0..{self.size - 1} (or -1 with a custom_task), got {index!r}")
        self._sessions_started += 1
        # Latency stream seeded per (seed, index, session number): reproducible, independent across sessions.
        rng = random.Random(f"{self.seed}:latency:{index}:{self._sessions_started}")
        return CalcSession(problem, prompt, self.max_rounds, step_latency_sampler(self.step_latency, rng))
