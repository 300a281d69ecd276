"""``kg``: AgentBench's knowledge-graph task. The agent answers a question by exploring a Freebase-style graph
with seven tools; the answer is a variable, executed as SPARQL and compared with the gold answer set.

Semantics follow upstream's function-calling task (THUDM/AgentBench, ``src/server/tasks/knowledgegraph``):

- opening: a system prompt with the rules and the round limit, then ``{question}\\nEntities: [names]``;
- tools ``get_relations(variable)``, ``get_neighbors(variable, relation)``, ``intersection(variable1, variable2)``,
  ``get_attributes(variable)``, ``argmax(variable, attribute)``, ``argmin(variable, attribute)``,
  ``count(variable)`` (see :mod:`.engine`); an argument ``#N`` is variable N, an entity name of the item is its
  id; every tool call of a message is executed and answered, errors as upstream words them (``Provide an
  invalid function name...``, ``Arguments do not match the function signature...``, ``Error processing tool
  call: ...``), and the episode goes on;
- a message without tool calls ends the episode if it says ``Final Answer: #N``: reward 1 iff the executed
  answers equal the gold set, ``score`` the F1 (status ``agent validation failed`` for a variable that does not
  exist); otherwise the agent is told ``No valid function calls found!...`` and the episode goes on;
- ``max_rounds`` assistant messages (upstream: 15), then ``task limit reached``.

Data: generated offline (:mod:`.generator`; default) or upstream's item files (``data``) on a graph that holds
their entities (a user's Freebase behind ``sparql_url``, or an N-Triples ``graph``), with upstream's ontology
folder (``ontology``).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from env_adapters.protocol import Index, Message, SampleStatus
from env_adapters.task import Session, StepResult, Task, TaskError, function_tool, register_task, run_blocking
from env_adapters.tasks.kg.backends import (
    QUERY_TIMEOUT_S,
    EmbeddedBackend,
    EndpointBackend,
    QueryTooCostly,
    SparqlBackend,
    VirtuosoServer,
    check_store_options,
)
from env_adapters.tasks.kg.engine import PARAM_ORDER, UPSTREAM_API_ATTRIBUTES, KGEngine, ToolError, Variable
from env_adapters.tasks.kg.generator import GeneratorConfig, generate_graph, generate_items
from env_adapters.tasks.kg.ontology import Ontology
from env_adapters.tasks.kg.sexpr import ProgramError

logger = logging.getLogger(__name__)

# Upstream's rules, reworded; the round limit is filled in.
SYSTEM_PROMPT = """\
You are an agent that answers questions from the knowledge stored in a knowledge base (KB). Use the tools to \
probe the KB: find the relations of entities, their neighbours, intersections and attributes, and determine the \
information that answers the question.
Remember:
- A variable is an entity or a set of entities resulting from previous queries.
- Use the tool that fits the question and follow the logical order (e.g. get the relations before the neighbours).
- Every variable produced gets an id starting from 0: #0 is the first variable, #1 the second, and so on. Judge \
after each one whether it is the final answer to the question.
- Once you have found the answer, respond with 'Final Answer: #id', where id is the id of the variable that holds \
the answer. For example, if #3 is the answer, you MUST respond with 'Final Answer: #3'. Do not call a tool to \
submit the final answer!
- Take one action at a time; you can take at most {max_round} actions to find the answer.
Note that you must finish the task in {max_round} rounds!
"""
SHORT_PROMPT = "Answer with the KB tools. Variables are #0, #1, ... When done, reply 'Final Answer: #id'."
PROMPTS = {"upstream": SYSTEM_PROMPT, "short": SHORT_PROMPT}
NO_CALL = "No valid function calls found! Need to recheck the function calls."
MAX_ARGUMENT_CHARS = 1000
"""Longest argument a call may carry (beyond, a tool error). Upstream has no bound; its entity ids, relations and
attributes are tens of characters, and a session keeps the relations of every entity it asked about: 42 calls on
distinct 3.9 MB ids left the worker 316 MiB larger."""
FINAL_ANSWER = re.compile(r"(?:Find|Final) Answer: #(\d+)")

_VAR = {"type": "string", "description": "an entity of the question or a variable such as #0"}
TOOLS = [
    function_tool("get_relations", "Fetch all relations of an entity or variable, to find useful connections in "
                  "the KB.", {"variable": _VAR}),
    function_tool("get_neighbors", "Return all entities connected to a variable through a relation; use it after "
                  "finding the variable's relations with get_relations().",
                  {"variable": _VAR, "relation": {"type": "string", "description": "a relation of the variable"}}),
    function_tool("intersection", "Intersect two variables of the same type.",
                  {"variable1": {"type": "string", "description": "the first variable"},
                   "variable2": {"type": "string", "description": "the second variable"}}),
    function_tool("get_attributes", "Fetch all numerical attributes of a variable, to find the entities with the "
                  "largest or smallest value of one.", {"variable": {"type": "string", "description": "a variable"}}),
    function_tool("argmax", "Find the entity with the largest value of an attribute; use it after "
                  "get_attributes().", {"variable": {"type": "string", "description": "a variable"},
                                        "attribute": {"type": "string", "description": "an attribute"}}),
    function_tool("argmin", "Find the entity with the smallest value of an attribute; use it after "
                  "get_attributes().", {"variable": {"type": "string", "description": "a variable"},
                                        "attribute": {"type": "string", "description": "an attribute"}}),
    function_tool("count", "Count the entities of a variable.",
                  {"variable": {"type": "string", "description": "a variable"}}),
]
BACKENDS = ("embedded", "virtuoso", "endpoint")


def f1(predicted: set[str], gold: set[str]) -> float:
    """Upstream's F1 of two answer sets (0 without overlap)."""
    overlap = len(predicted & gold)
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(predicted), overlap / len(gold)
    return 2 * precision * recall / (precision + recall)


def user_prompt(item: dict[str, Any]) -> str:
    return f"{item['question']}\nEntities: [{', '.join(item['entities'])}]"


def gold_answers(item: dict[str, Any]) -> set[str]:
    return {a["answer_argument"] for a in item["answer"]}


class KGSession(Session):
    """One question: the engine's tools, the variables made so far, the round count."""

    def __init__(self, task: KGTask, item: dict[str, Any]) -> None:
        self.task, self.item = task, item
        self.entities: dict[str, str] = item["entities"]
        self.engine = KGEngine(task.backend, task.ontology)
        self.variables: list[Variable] = []
        self.rounds = 0
        self.metrics: dict[str, Any] = {"rounds": 0, "tool_calls": 0, "tool_errors": 0, "score": 0.0}

    async def reset(self) -> StepResult:
        system = self.task.prompt.format(max_round=self.task.max_rounds)
        return StepResult(messages=[{"role": "system", "content": system},
                                    {"role": "user", "content": user_prompt(self.item)}], tools=TOOLS)

    async def step(self, message: Message) -> StepResult:
        self.rounds += 1
        self.metrics["rounds"] = self.rounds
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            calls = [calls]  # a malformed list is answered as one malformed call: the episode goes on
        if not calls:
            content = message.get("content")
            content = (content if isinstance(content, str) else "").split("Observation:")[0].replace("\\_", "_")
            answer = FINAL_ANSWER.findall(content)
            if answer:
                # A number past any variable (also one beyond Python's int() digit limit) names no variable.
                return await self._finish(int(answer[0]) if len(answer[0]) <= 9 else len(self.variables))
            replies = [{"role": "user", "content": NO_CALL}]
        else:
            replies = [await self._call(call) for call in calls]
        status = SampleStatus.TASK_LIMIT_REACHED if self.rounds >= self.task.max_rounds else SampleStatus.RUNNING
        return StepResult(messages=replies, status=status, metrics=self.metrics)

    async def _finish(self, index: int) -> StepResult:
        if index >= len(self.variables):
            return StepResult(status=SampleStatus.AGENT_VALIDATION_FAILED, metrics=self.metrics)
        try:
            predicted = set(await self.engine.final_execute(self.variables[index]))
        except (ProgramError, QueryTooCostly):  # e.g. a COUNT of a COUNT, which every tool accepts: upstream's agent
            # validation failed; also an answer too costly to compute
            return StepResult(status=SampleStatus.AGENT_VALIDATION_FAILED, metrics=self.metrics)
        gold = gold_answers(self.item)
        self.metrics["score"] = f1(predicted, gold)
        return StepResult(status=SampleStatus.COMPLETED, reward=float(predicted == gold), metrics=self.metrics)

    async def _call(self, call: Any) -> Message:
        self.metrics["tool_calls"] += 1
        if not isinstance(call, dict):
            self.metrics["tool_errors"] += 1
            content = f"Error processing tool call: a call must be an object, got {repr(call)[:200]}"
            return {"role": "user", "content": content}
        call_id = call.get("id")
        try:
            function = call["function"]
            name, arguments = function["name"], function.get("arguments") or "{}"
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
            if name not in PARAM_ORDER and name not in UPSTREAM_API_ATTRIBUTES:
                content = f"Provide an invalid function name. Function {name} does not exist"
            else:
                try:  # a name of upstream's API object that is no tool has no parameters there: a KeyError
                    args = [self._resolve(arguments[param]) for param in PARAM_ORDER[name]]
                except KeyError:
                    content = f"Arguments do not match the function signature. Error processing arguments for {name}"
                else:
                    variable, content = await getattr(self.engine, name)(*args)
                    if "##" in content:
                        content = content.replace("##", f"#{len(self.variables)}")
                        self.variables.append(variable)
        except (ToolError, ProgramError, QueryTooCostly, LookupError, ValueError, TypeError, AttributeError) as e:
            content = f"Error processing tool call: {e}"
        if content.startswith(("Provide", "Arguments", "Error")):
            self.metrics["tool_errors"] += 1
        if call_id is None:  # upstream answers a call without an id as the user
            return {"role": "user", "content": content}
        function = call.get("function")
        return {"role": "tool", "tool_call_id": call_id,
                "name": function.get("name") if isinstance(function, dict) else None, "content": content}

    def _resolve(self, value: Any) -> Variable | Any:
        if isinstance(value, str) and len(value) > MAX_ARGUMENT_CHARS:
            raise ToolError(f"an argument may be at most {MAX_ARGUMENT_CHARS} characters")
        if isinstance(value, str) and value.startswith("#"):
            return self.variables[int(value[1:])]
        if isinstance(value, str) and value in self.entities:
            return self.entities[value]
        return value


@register_task("kg")
class KGTask(Task):
    """The knowledge-graph task family.

    Args:
        backend: ``embedded`` (in-process Oxigraph store, default), ``virtuoso`` (a private Virtuoso server
            started and bulk-loaded by the task) or ``endpoint`` (an existing SPARQL endpoint: ``sparql_url``).
        sparql_url: ``http://host:port/sparql`` of an existing endpoint (e.g. a full Freebase), for ``endpoint``.
        data: An upstream item file (JSON list: ``question``, ``entities``, ``s_expression``, ``answer``...);
            without it, questions are generated.
        ontology: Upstream's ontology folder (``vocab.json``, ``fb_roles``); required with ``data``.
        graph: N-Triples holding the items' entities, for ``data`` on ``embedded`` or ``virtuoso``.
        preset: ``standard`` or ``easy`` generator settings, refined by the knobs below (generated data only).
        seed, entities_per_type, types, distractors, max_hops, templates: generator knobs (see
            :class:`~env_adapters.tasks.kg.generator.GeneratorConfig`).
        size: Generated questions (indices ``0..size-1``, all distinct).
        max_rounds: Assistant messages per episode (upstream: 15).
        prompt: ``upstream`` (upstream's rules) or ``short`` (one line, for tiny models).
        virtuoso_memory_mb: Page buffers of the Virtuoso server.
        query_cache: Distinct queries whose answers the task remembers for all its sessions (the graph does not
            change while it runs); 0 sends every query to the store.
        query_processes: Processes of the embedded store (each holds the graph and answers one query at a time).
        query_timeout: Seconds one query of the embedded store may run; a longer one is stopped and its tool call
            answered ``Error processing tool call: ...`` (a final answer: ``agent validation failed``).
    """

    def __init__(self, backend: str = "embedded", sparql_url: str | None = None, data: str | None = None,
                 ontology: str | None = None, graph: str | None = None, preset: str = "standard", seed: int = 0,
                 size: int = 1000, max_rounds: int = 15, prompt: str = "upstream", virtuoso_memory_mb: int = 256,
                 query_cache: int = 10000, query_processes: int = 2, query_timeout: float = QUERY_TIMEOUT_S,
                 **knobs: Any) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"kg: backend must be one of {list(BACKENDS)}, got {backend!r}")
        if (backend == "endpoint") != (sparql_url is not None):
            raise ValueError("kg: give sparql_url exactly when backend is 'endpoint'")
        if prompt not in PROMPTS:
            raise ValueError(f"kg: prompt must be one of {sorted(PROMPTS)}, got {prompt!r}")
        if max_rounds < 1 or size < 1:
            raise ValueError(f"kg: max_rounds and size must be >= 1, got {max_rounds} and {size}")
        if query_cache < 0:
            raise ValueError(f"kg: query_cache must be >= 0, got {query_cache}")
        check_store_options(query_processes, query_timeout)
        self.query_processes, self.query_timeout = query_processes, query_timeout
        unknown = set(knobs) - {"entities_per_type", "types", "distractors", "max_hops", "templates"}
        if unknown:
            raise TypeError(f"kg: unknown option(s) {sorted(unknown)}")
        self.backend_name, self.sparql_url, self.max_rounds = backend, sparql_url, max_rounds
        self.prompt, self.virtuoso_memory_mb, self.query_cache = PROMPTS[prompt], virtuoso_memory_mb, query_cache
        self.graph_path = Path(graph) if graph else None
        self.ntriples: str | None = None
        if data is None:
            if ontology or graph:
                raise ValueError("kg: ontology and graph go with data (an upstream item file); generated questions "
                                 "bring their own")
            self.config = GeneratorConfig.preset(preset, seed=seed, **knobs)
            generated = generate_graph(self.config)
            self.ontology, self.ntriples = generated.ontology, generated.ntriples()
            self.items = generate_items(generated, self.config, size)
        else:
            if knobs or ontology is None:
                raise ValueError("kg: with data, give ontology (upstream's ontology folder) and no generator knobs")
            if backend != "endpoint" and self.graph_path is None:
                raise ValueError(f"kg: data on backend {backend!r} needs graph (N-Triples holding the items' "
                                 "entities); or use backend: endpoint with sparql_url")
            self.ontology = Ontology.load(ontology)
            self.items = load_items(data)
        self.backend: SparqlBackend | None = None
        self.server: VirtuosoServer | None = None

    def indices(self) -> list[Index]:
        return list(range(len(self.items)))

    def expert(self, index: Index, messages: list[Message]) -> Message:
        """The scripted expert (see the family's ``expert`` module)."""
        from env_adapters.tasks.kg.expert import kg_expert

        return kg_expert(self, index, messages)

    async def setup(self) -> None:
        source = self.graph_path or self.ntriples
        if self.backend_name == "embedded":
            self.backend = await run_blocking(EmbeddedBackend, source, cache_size=self.query_cache,
                                              processes=self.query_processes, query_timeout=self.query_timeout)
        elif self.backend_name == "endpoint":
            self.backend = EndpointBackend(self.sparql_url, cache_size=self.query_cache)
        else:
            # Started on the event-loop thread, which lives as long as the task (parent-death signal).
            load_dirs = (self.graph_path.resolve().parent,) if self.graph_path else ()
            self.server = VirtuosoServer(memory_mb=self.virtuoso_memory_mb).start(load_dirs)
            path = self.graph_path
            if path is None:
                path = self.server.folder / "graph.nt"
                path.write_text(self.ntriples)
            self.server.load(path)
            self.backend = EndpointBackend(self.server.url, cache_size=self.query_cache)

    async def healthy(self) -> bool:
        """Whether the SPARQL store answers (an endpoint, a Virtuoso server; the embedded store always does)."""
        return self.backend is not None and await self.backend.alive()

    async def teardown(self) -> None:
        backend, self.backend = self.backend, None
        if backend is not None:
            await backend.close()
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    async def start_session(self, index: Index, custom_task: dict[str, Any] | None = None) -> Session:
        if self.backend is None:
            raise TaskError("kg: the task is not set up (setup() was not awaited)")
        if index == -1 and custom_task is not None:
            return KGSession(self, validate_item(custom_task))
        if not isinstance(index, int) or not 0 <= index < len(self.items):
            raise TaskError(f"kg index must be in 0..{len(self.items) - 1} (or -1 with a custom_task), got {index!r}")
        return KGSession(self, self.items[index])


def validate_item(item: Any) -> dict[str, Any]:
    """Check an item has upstream's fields.

    Raises:
        TaskError: a field is missing or has the wrong shape (named in the message).
    """
    if not isinstance(item, dict):
        raise TaskError(f"kg item must be a JSON object, got {type(item).__name__}")
    for key, kind in (("question", str), ("entities", dict), ("answer", list)):
        if not isinstance(item.get(key), kind):
            raise TaskError(f"kg item {item.get('qid', '?')}: {key!r} must be a {kind.__name__}")
    if not all(isinstance(a, dict) and "answer_argument" in a for a in item["answer"]):
        raise TaskError(f"kg item {item.get('qid', '?')}: every answer needs an 'answer_argument'")
    return item


def load_items(path: str | Path) -> list[dict[str, Any]]:
    """Upstream items from a JSON list file, validated."""
    with open(path) as f:
        items = json.load(f)
    if not isinstance(items, list):
        raise ValueError(f"kg: {path} must hold a JSON list of items")
    return [validate_item(item) for item in items]
