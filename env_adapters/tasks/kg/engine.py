"""The seven knowledge-base tools with AgentBench's semantics (its ``knowledgegraph/api.py``).

A :class:`Variable` is a typed s-expression program; tools that return a set create one, tools that return a list
(relations, attributes) print it. Nothing is materialised until the final answer: ``get_relations`` and
``get_attributes`` of a variable query the store for the predicates of its members, and :meth:`KGEngine.final_execute`
runs the answer variable's program. As upstream, a relation is accepted by ``get_neighbors`` only if it is among
the variable's relations (computed on first use), an attribute by ``argmax``/``argmin`` only if it is among its
attributes, and ``intersection`` needs two variables of the same type. Deliberate difference: relation and
attribute lists are printed sorted (upstream prints a Python set, in no stable order).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from env_adapters.tasks.kg.backends import SparqlBackend
from env_adapters.tasks.kg.ontology import Ontology
from env_adapters.tasks.kg.sexpr import parse, relations_query, to_sparql

ENTITY_ARG = re.compile(r"^([mf])\.[\w_]+$")
# Argument names of each tool, in the order the functions take them (upstream's TOOLS_PARAM_ORDER).
PARAM_ORDER = {
    "get_relations": ("variable",),
    "get_neighbors": ("variable", "relation"),
    "intersection": ("variable1", "variable2"),
    "get_attributes": ("variable",),
    "argmax": ("variable", "attribute"),
    "argmin": ("variable", "attribute"),
    "count": ("variable",),
}
# What else upstream's tool dispatch finds on its ``API`` object (``getattr(api, name)``): a call naming one of these
# gets "Arguments do not match the function signature" there (no TOOLS_PARAM_ORDER entry), not "invalid function".
UPSTREAM_API_ATTRIBUTES = frozenset({"final_execute", "union", "sparql_executor", "task_id", "__dict__", "__module__",
                                     "__weakref__", *dir(object)})


class ToolError(ValueError):
    """The agent's call cannot be executed; the message is shown to it."""


MAX_PROGRAM_CHARS = 64 * 1024
"""Longest program a variable may hold. Upstream's gold programs are a few hundred characters; without a bound,
``intersection(#k, #k)`` doubles the program at every call (22 calls in one 3.3 KB message built 196 MiB)."""
MAX_PROGRAM_DEPTH = 64
"""Deepest nesting a variable's program may have. Upstream's gold programs nest a handful of levels; one message of
3,000 ``get_neighbors`` calls nests 3,000 deep in 33 KB, and the recursive parser and compiler then fail
(``RecursionError``) on the answer or on the next query."""


def _depth(program: str) -> int:
    depth = deepest = 0
    for char in program:
        if char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
    return deepest


@dataclass(frozen=True)
class Variable:
    """A set of entities (or a number) as the program that computes it; ``type`` is its Freebase type.

    Raises:
        ToolError: the program is longer than :data:`MAX_PROGRAM_CHARS` or nests deeper than
            :data:`MAX_PROGRAM_DEPTH` (the message is shown to the agent).
    """

    type: str
    program: str

    def __post_init__(self) -> None:
        if len(self.program) > MAX_PROGRAM_CHARS:
            raise ToolError(f"the resulting variable's program would exceed {MAX_PROGRAM_CHARS} characters")
        if _depth(self.program) > MAX_PROGRAM_DEPTH:
            raise ToolError(f"the resulting variable's program would nest deeper than {MAX_PROGRAM_DEPTH} levels")


Observation = tuple[Variable | None, str]  # a new variable (if any) and the text; "##" stands for its id


class KGEngine:
    """The tools of one session (its relation/attribute caches are per session, as upstream's per task id).

    Args:
        backend: Where queries run.
        ontology: Relations and attributes the tools may show; range types of relations.
    """

    def __init__(self, backend: SparqlBackend, ontology: Ontology) -> None:
        self.backend, self.ontology = backend, ontology
        self._relations: dict[Variable | str, list[str]] = {}
        self._attributes: dict[Variable, list[str]] = {}

    async def final_execute(self, variable: Variable) -> list[str]:
        """The answers of a variable (for a count: one value, the number)."""
        return await self.backend.select(to_sparql(parse(variable.program)))

    async def _predicates(self, node: Variable | str) -> set[str]:
        return set(await self.backend.select(relations_query(parse(_program(node)))))

    async def get_relations(self, variable: Variable | str) -> Observation:
        if not isinstance(variable, Variable) and not ENTITY_ARG.match(str(variable)):
            raise ToolError("get_relations: variable must be a variable or an entity")
        if variable not in self._relations:
            self._relations[variable] = sorted(await self._predicates(variable) & self.ontology.relations)
        return None, f"Observation: [{', '.join(self._relations[variable])}]"

    async def get_neighbors(self, variable: Variable | str, relation: str) -> Observation:
        if not isinstance(variable, Variable) and not ENTITY_ARG.match(str(variable)):
            raise ToolError("get_neighbors: variable must be a variable or an entity")
        if variable not in self._relations:
            await self.get_relations(variable)
        if relation not in self._relations[variable]:
            raise ToolError("get_neighbors: relation must be a relation of the variable")
        kind = self.ontology.range_of(relation)
        return Variable(kind, f"(JOIN {relation}_inv {_program(variable)})"), \
            f"Observation: variable ##, which are instances of {kind}"

    async def intersection(self, variable1: Variable | str, variable2: Variable | str) -> Observation:
        _need_variable(variable1, "type")  # upstream compares the types first
        _need_variable(variable2, "type")
        if variable1.type != variable2.type:
            raise ToolError("intersection: two variables must have the same type")
        return Variable(variable1.type, f"(AND {variable1.program} {variable2.program})"), \
            f"Observation: variable ##, which are instances of {variable1.type}"

    async def get_attributes(self, variable: Variable | str) -> Observation:
        _need_variable(variable, "program", hashed=True)
        if variable not in self._attributes:
            self._attributes[variable] = sorted(await self._predicates(variable) & self.ontology.attributes)
        return None, f"Observation: [{', '.join(self._attributes[variable])}]"

    async def _superlative(self, op: str, variable: Variable | str, attribute: str) -> Observation:
        _need_variable(variable, "program", hashed=True)
        if variable not in self._attributes:
            await self.get_attributes(variable)
        if attribute not in self._attributes[variable]:
            raise ToolError(f"{op.lower()}: attribute must be an attribute of the variable")
        return Variable(variable.type, f"({op} {variable.program} {attribute})"), \
            f"Observation: variable ##, which are instances of {variable.type}"

    async def argmax(self, variable: Variable | str, attribute: str) -> Observation:
        return await self._superlative("ARGMAX", variable, attribute)

    async def argmin(self, variable: Variable | str, attribute: str) -> Observation:
        return await self._superlative("ARGMIN", variable, attribute)

    async def count(self, variable: Variable | str) -> Observation:
        _need_variable(variable, "program")
        return Variable("type.int", f"(COUNT {variable.program})"), "Observation: variable ##, which is a number"


def _need_variable(value: object, attribute: str, hashed: bool = False) -> None:
    """Refuse a value that is no variable with the error upstream's code raises on it: the first attribute it reads of
    a ``Variable`` (``'str' object has no attribute 'program'``), or hashing it for its caches (``hashed``)."""
    if isinstance(value, Variable):
        return
    if hashed and value.__hash__ is None:
        raise ToolError(f"unhashable type: '{type(value).__name__}'")
    raise ToolError(f"'{type(value).__name__}' object has no attribute '{attribute}'")


def _program(node: Variable | str) -> str:
    return node.program if isinstance(node, Variable) else node
