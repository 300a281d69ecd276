"""S-expressions of AgentBench's knowledge-graph task (GrailQA's logical forms) and their translation to SPARQL.

A program is a nested list parsed from text such as ``(AND film.film (JOIN (R film.film.directed_by) m.0abc))``:

- an entity (``m.``/``g.``/``f.`` id), a class (``film.film``) or a typed literal (``"1990"^^xsd:integer``);
- ``(JOIN r X)``: everything whose ``r`` is in ``X``; ``(JOIN (R r) X)``: the ``r`` of everything in ``X``;
  the tools write ``r_inv`` for ``(R r)`` (upstream's variables) and :func:`parse` accepts both;
- ``(AND X Y)``: intersection (``X`` may be a class: a type constraint);
- ``(COUNT X)``; ``(ARGMAX X path)`` / ``(ARGMIN X path)`` with ``path`` an attribute or a ``JOIN`` chain of
  relations ending in one; ``(le|lt|ge|gt r literal)``.

:func:`to_sparql` compiles a program to one SELECT with upstream's answer semantics: the topic entities of the
program are never answers, literals in other languages than English are dropped, ``COUNT`` counts distinct
answers, and superlatives return every member that reaches the extreme value. The query is standard SPARQL 1.1, so
an embedded store and Virtuoso (upstream's engine) return the same answers.
"""

from __future__ import annotations

import itertools
import re

FB = "http://rdf.freebase.com/ns/"
XSD = "http://www.w3.org/2001/XMLSchema#"
ENTITY = re.compile(r"^[mgf]\.[\w_]+$")
_TOKEN = re.compile(r'\(|\)|"(?:[^"\\]|\\.)*"(?:\^\^\S+?(?=[\s()]|$))?|[^\s()]+')
_COMPARE = {"le": "<=", "lt": "<", "ge": ">=", "gt": ">"}

Program = str | list  # a symbol or a nested list of programs


class ProgramError(ValueError):
    """A program that is not a well-formed s-expression of the supported operators."""


def parse(text: str) -> Program:
    """Parse an s-expression; ``r_inv`` symbols become ``["R", r]``.

    Raises:
        ProgramError: unbalanced parentheses or trailing text.
    """
    tokens = _TOKEN.findall(text)
    pos = 0

    def read() -> Program:
        nonlocal pos
        if pos >= len(tokens):
            raise ProgramError(f"unexpected end of s-expression {text!r}")
        token = tokens[pos]
        pos += 1
        if token == ")":
            raise ProgramError(f"unexpected ')' in s-expression {text!r}")
        if token != "(":
            return ["R", token[:-4]] if token.endswith("_inv") and len(token) > 4 else token
        items = []
        while pos < len(tokens) and tokens[pos] != ")":
            items.append(read())
        if pos >= len(tokens):
            raise ProgramError(f"unbalanced '(' in s-expression {text!r}")
        pos += 1
        return items

    program = read()
    if pos != len(tokens):
        raise ProgramError(f"trailing text after the s-expression {text!r}")
    return program


def unparse(program: Program) -> str:
    """The s-expression text of a program (``["R", r]`` written as ``(R r)``)."""
    if isinstance(program, str):
        return program
    return "(" + " ".join(unparse(p) for p in program) + ")"


def entities_of(program: Program) -> set[str]:
    """The entity ids a program mentions."""
    if isinstance(program, str):
        return {program} if ENTITY.match(program) else set()
    return set().union(*(entities_of(p) for p in program)) if program else set()


def iri(name: str) -> str:
    """A Freebase name as a full IRI (prefixed names like ``ns:a.country.b`` trip some SPARQL parsers)."""
    return f"<{FB}{name}>"


def _term(symbol: str) -> str:
    """A symbol as a SPARQL term: a Freebase IRI, or a typed literal (``"v"^^xsd:t`` or ``"v"^^<iri>``)."""
    if symbol.startswith('"'):
        value, _, datatype = symbol.rpartition("^^")
        if not datatype:
            return symbol
        if datatype.startswith("xsd:"):
            datatype = XSD + datatype[4:]
        return f"{value}^^<{datatype.strip('<>')}>"
    if "^^" in symbol:  # GrailQA's unquoted form 1990^^http://www.w3.org/2001/XMLSchema#gYear
        value, _, datatype = symbol.partition("^^")
        return f'"{value}"^^<{datatype}>'
    return iri(symbol)


def _is_value(symbol: str) -> bool:
    return symbol.startswith('"') or "^^" in symbol


class _Compiler:
    def __init__(self) -> None:
        self._ids = itertools.count()

    def var(self) -> str:
        return f"?v{next(self._ids)}"

    def relation(self, rel: Program) -> tuple[str, bool]:
        """``(predicate IRI, reversed)`` of ``r`` or ``(R r)``."""
        if isinstance(rel, list):
            if len(rel) != 2 or rel[0] != "R" or not isinstance(rel[1], str):
                raise ProgramError(f"expected a relation or (R relation), got {unparse(rel)}")
            return iri(rel[1]), True
        return iri(rel), False

    def path(self, path: Program) -> list[Program]:
        """The relations of a superlative's path: ``r`` or ``(JOIN r1 (JOIN r2 attr))``."""
        if isinstance(path, list) and path and path[0] == "JOIN":
            if len(path) != 3:
                raise ProgramError(f"JOIN takes 2 arguments: {unparse(path)}")
            return [path[1], *self.path(path[2])]
        return [path]

    def set_of(self, program: Program, out: str) -> list[str]:
        """Graph patterns binding ``out`` to the members of ``program``."""
        if isinstance(program, str):
            if ENTITY.match(program) or _is_value(program):
                return [f"VALUES {out} {{ {_term(program)} }}"]
            return [f"{out} {iri('type.object.type')} {iri(program)} ."]
        if not program:
            raise ProgramError("empty s-expression")
        op, args = program[0], program[1:]
        if op == "JOIN":
            if len(args) != 2:
                raise ProgramError(f"JOIN takes 2 arguments: {unparse(program)}")
            predicate, reverse = self.relation(args[0])
            if isinstance(args[1], str) and (ENTITY.match(args[1]) or _is_value(args[1])):
                other, patterns = _term(args[1]), []
            else:
                other = self.var()
                patterns = self.set_of(args[1], other)
            return [*patterns, f"{other} {predicate} {out} ." if reverse else f"{out} {predicate} {other} ."]
        if op == "AND":
            if len(args) != 2:
                raise ProgramError(f"AND takes 2 arguments: {unparse(program)}")
            return self.set_of(args[0], out) + self.set_of(args[1], out)
        if op in _COMPARE:
            if len(args) != 2 or not isinstance(args[1], str):
                raise ProgramError(f"{op} takes a relation and a literal: {unparse(program)}")
            value = self.var()
            predicate, _ = self.relation(args[0])
            return [f"{out} {predicate} {value} .", f"FILTER ({value} {_COMPARE[op]} {_term(args[1])})"]
        if op in ("ARGMAX", "ARGMIN"):
            if len(args) != 2:
                raise ProgramError(f"{op} takes 2 arguments: {unparse(program)}")
            # Members whose value equals the extreme value, found by a sub-select over the same set.
            inner, value = self.var(), self.var()
            order = f"DESC({value})" if op == "ARGMAX" else value
            topic = sorted(entities_of(args[0]))  # never answers, so never the extreme either
            members = [*self.set_of(args[0], inner), *(f"FILTER ({inner} != {iri(e)})" for e in topic),
                       *self.walk(args[1], inner, value)]
            best = f"{{ SELECT {value} WHERE {{ {' '.join(members)} }} ORDER BY {order} LIMIT 1 }}"
            return [*self.set_of(args[0], out), *self.walk(args[1], out, value), best]
        if op == "COUNT":
            raise ProgramError("COUNT may only be the outermost operator")
        raise ProgramError(f"unsupported operator {op!r} in {unparse(program)}")

    def walk(self, path: Program, start: str, end: str) -> list[str]:
        relations = self.path(path)
        nodes = [start, *(self.var() for _ in relations[:-1]), end]
        patterns = []
        for rel, a, b in zip(relations, nodes[:-1], nodes[1:], strict=True):
            predicate, reverse = self.relation(rel)
            patterns.append(f"{b} {predicate} {a} ." if reverse else f"{a} {predicate} {b} .")
        return patterns


def _answers(program: Program) -> list[str]:
    """Graph patterns binding ``?x`` to the program's answers, the topic entities excluded."""
    patterns = _Compiler().set_of(program, "?x")
    patterns.extend(f"FILTER (?x != {iri(e)})" for e in sorted(entities_of(program)))
    return patterns


def to_sparql(program: Program) -> str:
    """One SELECT whose single column holds the program's answers (one row: the count, for ``COUNT``).

    Raises:
        ProgramError: an unsupported or malformed program.
    """
    count = isinstance(program, list) and program[:1] == ["COUNT"]
    if count:
        if len(program) != 2:
            raise ProgramError(f"COUNT takes 1 argument: {unparse(program)}")
        program = program[1]
    patterns = [*_answers(program), "FILTER (!isLiteral(?x) || lang(?x) = '' || langMatches(lang(?x), 'en'))"]
    head = "SELECT (COUNT(DISTINCT ?x) AS ?count)" if count else "SELECT DISTINCT ?x"
    return "\n".join([head, "WHERE {", *patterns, "}"])


def relations_query(program: Program) -> str:
    """The predicates leaving any member of ``program`` (upstream's ``get_relations``/``get_attributes`` query).

    One flat pattern, not the answers' SELECT as a sub-query: Virtuoso spends about a fifth less time on it (less to
    compile), and a literal (the language filter's concern) has no predicates anyway.
    """
    if isinstance(program, str) and ENTITY.match(program):
        return f"SELECT DISTINCT ?rel WHERE {{ {iri(program)} ?rel ?obj . }}"
    return "\n".join(["SELECT DISTINCT ?rel WHERE {", *_answers(program), "?x ?rel ?obj .", "}"])
