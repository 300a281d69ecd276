"""kg on a hand-written graph: each tool's observation, rewards and F1, upstream's error messages, round limit,
the upstream-format loader, and the endpoint backend against a local SPARQL endpoint."""

from __future__ import annotations

import json

import pytest

from env_adapters.protocol import SampleStatus
from env_adapters.task import get_task_class
from env_adapters.tasks.kg.engine import MAX_PROGRAM_CHARS, MAX_PROGRAM_DEPTH
from env_adapters.tasks.kg.ontology import Ontology
from env_adapters.tasks.kg.sexpr import FB, ProgramError, parse, to_sparql, unparse
from env_adapters.tasks.kg.task import MAX_ARGUMENT_CHARS, NO_CALL, KGTask, f1

from .support import sparql_endpoint

TRIPLES = [
    ("m.f1", "film.film.directed_by", "m.p1"), ("m.f2", "film.film.directed_by", "m.p1"),
    ("m.f3", "film.film.directed_by", "m.p2"), ("m.p1", "people.person.nationality", "m.c1"),
    ("m.p2", "people.person.nationality", "m.c1"),
]
REVERSE = {"film.film.directed_by": "people.person.films_directed",
           "people.person.nationality": "location.country.citizens"}
RUNTIME = {"m.f1": 100, "m.f2": 120, "m.f3": 90}
NAMES = {"m.f1": "Alpha", "m.f2": "Beta", "m.f3": "Gamma", "m.p1": "Ann", "m.p2": "Bob", "m.c1": "Xland"}
ITEMS = [
    {"qid": "films", "question": "which films did Ann direct?", "entities": {"Ann": "m.p1"},
     "s_expression": "(AND film.film (JOIN film.film.directed_by m.p1))",
     "actions": ["get_relations(m.p1)", "get_neighbors(m.p1,people.person.films_directed)"],
     "answer": [{"answer_type": "Entity", "answer_argument": "m.f1"},
                {"answer_type": "Entity", "answer_argument": "m.f2"}]},
    {"qid": "count", "question": "how many films did Ann direct?", "entities": {"Ann": "m.p1"},
     "s_expression": "(COUNT (AND film.film (JOIN film.film.directed_by m.p1)))",
     "actions": ["get_relations(m.p1)", "get_neighbors(m.p1,people.person.films_directed)", "count(#0)"],
     "answer": [{"answer_type": "Value", "answer_argument": "2"}]},
]


def ntriples() -> str:
    lines = [f'<{FB}{m}> <{FB}type.object.name> "{n}"@en .' for m, n in NAMES.items()]
    for s, r, o in TRIPLES:
        lines += [f"<{FB}{s}> <{FB}{r}> <{FB}{o}> .", f"<{FB}{o}> <{FB}{REVERSE[r]}> <{FB}{s}> ."]
    lines += [f'<{FB}{m}> <{FB}film.film.runtime> "{v}"^^<http://www.w3.org/2001/XMLSchema#integer> .'
              for m, v in RUNTIME.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture
def files(tmp_path):
    roles = {"film.film.directed_by": ("film.film", "people.person"),
             "people.person.films_directed": ("people.person", "film.film"),
             "people.person.nationality": ("people.person", "location.country"),
             "location.country.citizens": ("location.country", "people.person"),
             "film.film.runtime": ("film.film", "type.int")}
    relations = frozenset(r for r in roles if r != "film.film.runtime")
    Ontology(relations, frozenset({"film.film.runtime"}), roles).save(tmp_path / "ontology")
    (tmp_path / "graph.nt").write_text(ntriples())
    (tmp_path / "items.json").write_text(json.dumps(ITEMS))
    return {"data": str(tmp_path / "items.json"), "ontology": str(tmp_path / "ontology"),
            "graph": str(tmp_path / "graph.nt")}


def call(name, call_id="c1", **arguments):
    function = {"name": name, "arguments": json.dumps(arguments)}
    tool_call = {"id": call_id, "type": "function", "function": function}
    return {"role": "assistant", "content": "", "tool_calls": [tool_call]}


def say(text):
    return {"role": "assistant", "content": text}


async def opened(task, index=0):
    await task.setup()
    session = await task.start_session(index)
    return session, await session.reset()


async def observe(session, message):
    result = await session.step(message)
    return result.messages[0]["content"]


async def test_tools_rewards_and_f1(files):
    task = KGTask(**files)
    assert get_task_class("kg") is KGTask and task.indices() == [0, 1]
    session, opening = await opened(task)
    assert [m["role"] for m in opening.messages] == ["system", "user"]
    assert "at most 15 actions" in opening.messages[0]["content"]
    assert opening.messages[1]["content"] == "which films did Ann direct?\nEntities: [Ann]"
    assert [t["function"]["name"] for t in opening.tools] == [
        "get_relations", "get_neighbors", "intersection", "get_attributes", "argmax", "argmin", "count"]
    # Names map to ids; only ontology relations show (not type.object.name), sorted.
    assert await observe(session, call("get_relations", variable="Ann")) == \
        "Observation: [people.person.films_directed, people.person.nationality]"
    reply = await session.step(call("get_neighbors", variable="Ann", relation="people.person.films_directed"))
    assert reply.messages == [{"role": "tool", "tool_call_id": "c1", "name": "get_neighbors",
                               "content": "Observation: variable #0, which are instances of film.film"}]
    assert await observe(session, call("get_relations", variable="#0")) == "Observation: [film.film.directed_by]"
    assert await observe(session, call("get_attributes", variable="#0")) == "Observation: [film.film.runtime]"
    assert await observe(session, call("argmax", variable="#0", attribute="film.film.runtime")) == \
        "Observation: variable #1, which are instances of film.film"
    assert await observe(session, call("argmin", variable="#0", attribute="film.film.runtime")) == \
        "Observation: variable #2, which are instances of film.film"
    assert await observe(session, call("count", variable="#0")) == "Observation: variable #3, which is a number"
    # Answering the argmax ({Beta}) against gold {Alpha, Beta}: reward 0, F1 2/3.
    done = await session.step(say("Thought: the longest one.\nFinal Answer: #1"))
    assert (done.status, done.reward) == (SampleStatus.COMPLETED, 0.0)
    assert done.metrics["score"] == pytest.approx(2 / 3) and done.metrics["rounds"] == 8
    session, _ = await opened(task)
    await session.step(call("get_neighbors", variable="m.p1", relation="people.person.films_directed"))
    done = await session.step(say("Final Answer: #0"))
    assert (done.status, done.reward, done.metrics["score"]) == (SampleStatus.COMPLETED, 1.0, 1.0)
    session, _ = await opened(task, 1)
    await session.step(call("get_neighbors", variable="Ann", relation="people.person.films_directed"))
    await session.step(call("count", variable="#0"))
    done = await session.step(say("Final Answer: #1"))
    assert (done.reward, done.metrics["score"]) == (1.0, 1.0)
    await task.teardown()


async def test_a_doubling_program_stops_at_its_bound_with_a_tool_error(files):
    # intersection(#k, #k) doubles the program each time; past MAX_PROGRAM_CHARS the call is refused, shown to the
    # agent like any tool error, and the session goes on with the variables it had.
    task = KGTask(max_rounds=40, **files)
    session, _ = await opened(task)
    await session.step(call("get_neighbors", variable="Ann", relation="people.person.films_directed"))
    k = 0
    while True:
        reply = await observe(session, call("intersection", variable1=f"#{k}", variable2=f"#{k}"))
        if reply.startswith("Error"):
            break
        k += 1
    assert reply == (f"Error processing tool call: the resulting variable's program would exceed {MAX_PROGRAM_CHARS} "
                     "characters")
    assert 5 <= k <= 16  # the first program is ~40 characters long: it doubles about 11 times
    assert await observe(session, call("count", variable=f"#{k}")) == \
        f"Observation: variable #{k + 1}, which is a number"
    await task.teardown()


async def test_a_program_nested_past_its_depth_bound_is_a_tool_error_and_the_session_goes_on(files):
    # One message of many count calls, each on the last one's variable (a COUNT of a COUNT, which the tool accepts as
    # upstream's does) nests the program one level deeper: past MAX_PROGRAM_DEPTH a call is refused (the recursive
    # parser fails on a few thousand levels); the answer is then the agent's failure, not a task error.
    task = KGTask(**files)
    session, _ = await opened(task)
    await session.step(call("get_neighbors", variable="Ann", relation="people.person.films_directed"))  # #0: depth 1
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "count", "arguments": json.dumps(
        {"variable": f"#{i}"})}} for i in range(80)]
    replies = (await session.step({"role": "assistant", "content": "", "tool_calls": calls})).messages
    refused = [i for i, reply in enumerate(replies) if reply["content"].startswith("Error")]
    assert replies[refused[0]]["content"] == ("Error processing tool call: the resulting variable's program would "
                                              f"nest deeper than {MAX_PROGRAM_DEPTH} levels")
    assert refused[0] == MAX_PROGRAM_DEPTH - 1  # count(#i) makes #(i + 1), i + 2 levels deep
    done = await session.step(say(f"Final Answer: #{refused[0]}"))
    assert done.status is SampleStatus.AGENT_VALIDATION_FAILED
    await task.teardown()


async def test_upstream_messages_and_limits(files):
    task = KGTask(max_rounds=12, **files)
    session, opening = await opened(task)
    assert "at most 12 actions" in opening.messages[0]["content"]
    assert await observe(session, call("lookup", variable="Ann")) == \
        "Provide an invalid function name. Function lookup does not exist"
    assert await observe(session, call("get_neighbors", variable="Ann")) == \
        "Arguments do not match the function signature. Error processing arguments for get_neighbors"
    assert await observe(session, call("get_relations", variable="#4")) == \
        "Error processing tool call: list index out of range"
    assert await observe(session, call("get_relations", variable="Nobody")) == \
        "Error processing tool call: get_relations: variable must be a variable or an entity"
    assert await observe(session, call("get_neighbors", variable="Ann", relation="film.film.directed_by")) == \
        "Error processing tool call: get_neighbors: relation must be a relation of the variable"
    await session.step(call("get_neighbors", variable="Ann", relation="people.person.films_directed"))
    await session.step(call("get_neighbors", variable="Ann", relation="people.person.nationality"))
    assert await observe(session, call("intersection", variable1="#0", variable2="#1")) == \
        "Error processing tool call: intersection: two variables must have the same type"
    assert await observe(session, call("argmax", variable="#1", attribute="film.film.runtime")) == \
        "Error processing tool call: argmax: attribute must be an attribute of the variable"
    reply = await session.step(say("I am not sure yet."))
    assert reply.messages == [{"role": "user", "content": NO_CALL}] and reply.status is SampleStatus.RUNNING
    assert reply.metrics["tool_errors"] == 7
    last = await session.step(say("still thinking"))
    assert last.status is SampleStatus.RUNNING
    last = await session.step(say("still thinking"))
    assert (last.status, last.reward) == (SampleStatus.TASK_LIMIT_REACHED, 0.0)
    session, _ = await opened(task)
    bad = await session.step(say("Final Answer: #3"))
    assert bad.status is SampleStatus.AGENT_VALIDATION_FAILED and bad.reward == 0.0
    session, _ = await opened(task)
    bad = await session.step(say("Final Answer: #" + "9" * 5000))  # past int()'s digit limit: no variable either
    assert bad.status is SampleStatus.AGENT_VALIDATION_FAILED and bad.reward == 0.0
    await task.teardown()


async def test_an_entity_or_an_api_name_that_is_no_tool_gets_upstreams_python_messages(files):
    # Upstream calls its API object's method with the entity's id and answers with the exception's text; a name of
    # that object which is no tool passes getattr there and fails on the tool's parameter list.
    task = KGTask(**files)
    session, _ = await opened(task)
    for name in ("count", "get_attributes"):
        assert await observe(session, call(name, variable="Ann")) == \
            "Error processing tool call: 'str' object has no attribute 'program'"
    assert await observe(session, call("argmax", variable="Ann", attribute="film.film.runtime")) == \
        "Error processing tool call: 'str' object has no attribute 'program'"
    assert await observe(session, call("intersection", variable1="Ann", variable2="Ann")) == \
        "Error processing tool call: 'str' object has no attribute 'type'"
    assert await observe(session, call("count", variable=5)) == \
        "Error processing tool call: 'int' object has no attribute 'program'"
    assert await observe(session, call("get_attributes", variable=[1])) == \
        "Error processing tool call: unhashable type: 'list'"
    for name in ("union", "final_execute", "__init__"):
        assert await observe(session, call(name, variable1="#0", variable2="#0")) == \
            f"Arguments do not match the function signature. Error processing arguments for {name}"
    await task.teardown()



@pytest.mark.parametrize("message", [
    {"role": "assistant", "content": "", "tool_calls": "get_relations"},
    {"role": "assistant", "content": "", "tool_calls": {"function": {"name": "get_relations"}}},
    {"role": "assistant", "content": "", "tool_calls": 5},
    {"role": "assistant", "content": "", "tool_calls": True},
    {"role": "assistant", "content": "", "tool_calls": [None]},
    {"role": "assistant", "content": "", "tool_calls": [5]},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": "get_relations"}]},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": ["get_relations"]}]},
    {"role": "assistant", "content": 7},
])
async def test_a_malformed_call_is_answered_and_the_episode_goes_on(files, message):
    task = KGTask(**files)
    session, _ = await opened(task)
    result = await session.step(message)
    assert result.status is SampleStatus.RUNNING
    # One of upstream's notices (a tool error, a signature mismatch, or no call at all).
    assert result.messages[0]["content"].startswith(("Error processing tool call", "Arguments do not match", NO_CALL))
    await task.teardown()


def test_options_are_checked(files):
    with pytest.raises(ValueError, match="backend must be one of"):
        KGTask(backend="neo4j")
    with pytest.raises(ValueError, match="sparql_url exactly"):
        KGTask(backend="endpoint")
    with pytest.raises(ValueError, match="needs graph"):
        KGTask(data=files["data"], ontology=files["ontology"])
    with pytest.raises(TypeError, match="unknown option"):
        KGTask(hops=2)
    with pytest.raises(ValueError, match="max_hops must be"):
        KGTask(max_hops=5)
    with pytest.raises(FileNotFoundError, match="no vocab.json"):
        KGTask(data=files["data"], ontology="/nonexistent", graph=files["graph"])
    for bad in ({"query_processes": 0}, {"query_timeout": 0}):
        with pytest.raises(ValueError, match="query_processes must be >= 1 and query_timeout > 0"):
            KGTask(**bad)


def test_sexpr_translation():
    text = "(ARGMAX (AND film.film (JOIN film.film.directed_by_inv m.p1)) (JOIN film.film.x film.y.length))"
    program = parse(text)
    assert program[1][2][1] == ["R", "film.film.directed_by"]
    assert unparse(program) == text.replace("film.film.directed_by_inv", "(R film.film.directed_by)")
    sparql = to_sparql(parse("(COUNT (JOIN (R a.b.c) m.x))"))
    assert sparql.startswith("SELECT (COUNT(DISTINCT ?x) AS ?count)") and f"FILTER (?x != <{FB}m.x>)" in sparql
    for bad in ("(JOIN a.b.c", "(FOO a b)", "(AND a)", "(JOIN (COUNT m.x) m.y)", "(JOIN a (COUNT m.x))"):
        with pytest.raises(ProgramError):
            to_sparql(parse(bad))
    assert f1({"a", "b"}, {"b", "c"}) == 0.5 and f1(set(), {"a"}) == 0.0


async def test_endpoint_backend_matches_embedded(files):
    """The same episode on a SPARQL endpoint over HTTP and on the embedded store: identical transcripts."""
    from .support import play

    transcripts = []
    with sparql_endpoint(ntriples()) as url:
        for options in ({"graph": files["graph"]}, {"backend": "endpoint", "sparql_url": url}):
            task = KGTask(data=files["data"], ontology=files["ontology"], **options)
            await task.setup()
            try:
                transcripts.append([await play(task, i) for i in task.indices()])
            finally:
                await task.teardown()
    (embedded, endpoint) = transcripts
    assert [r.reward for r, _ in embedded] == [1.0, 1.0]
    assert [(r.reward, r.metrics, m) for r, m in embedded] == [(r.reward, r.metrics, m) for r, m in endpoint]


async def test_a_long_query_goes_to_an_endpoint_by_post(files):
    # Six self-intersections make a query past a GET's URL limit (seven made Virtuoso answer 400): it goes as a form
    # POST and is answered like any other.
    from .support import sparql_endpoint

    methods: list[str] = []
    with sparql_endpoint(ntriples(), methods) as url:
        task = KGTask(data=files["data"], ontology=files["ontology"], backend="endpoint", sparql_url=url)
        session, _ = await opened(task)
        await session.step(call("get_neighbors", variable="Ann", relation="people.person.films_directed"))
        for k in range(6):
            await session.step(call("intersection", variable1=f"#{k}", variable2=f"#{k}"))
        assert await observe(session, call("get_relations", variable="#6")) == "Observation: [film.film.directed_by]"
        await task.teardown()
    assert methods == ["GET", "POST"]


async def test_an_overlong_argument_is_a_tool_error_and_the_session_keeps_nothing_of_it(files):
    task = KGTask(**files)
    session, _ = await opened(task)
    for name, arguments in (("get_relations", {"variable": "m." + "x" * 1000}),
                            ("get_neighbors", {"variable": "Ann", "relation": "r" * 1001})):
        assert await observe(session, call(name, **arguments)) == \
            f"Error processing tool call: an argument may be at most {MAX_ARGUMENT_CHARS} characters"
    assert session.engine._relations == {}  # nothing of either call is kept
    assert await observe(session, call("get_relations", variable="m." + "x" * 997)) == "Observation: []"
    await task.teardown()


@pytest.mark.parametrize("second", ["count", "intersection"])
async def test_an_answer_the_compiler_refuses_is_the_agents_failure_not_a_task_error(files, second):
    # A COUNT of a COUNT, or an intersection of two counts: each tool accepts it, as upstream's does, and the answer
    # cannot be compiled; upstream's final answer then ends `agent validation failed`.
    task = KGTask(**files)
    session, _ = await opened(task, 1)
    await session.step(call("get_neighbors", variable="Ann", relation="people.person.films_directed"))
    await session.step(call("count", variable="#0"))
    await session.step(call(second, **({"variable": "#1"} if second == "count" else
                                       {"variable1": "#1", "variable2": "#1"})))
    done = await session.step(say("Final Answer: #2"))
    assert (done.status, done.reward) == (SampleStatus.AGENT_VALIDATION_FAILED, 0.0)
    await task.teardown()


async def test_a_query_past_its_time_bound_is_a_tool_error_and_the_session_goes_on():
    # Nine self-intersections make a 30 KB program whose relations query ran for minutes in Oxigraph (over 280 s on
    # the generated graph): the store stops it at its bound and the agent is told, as of any failed call.
    task = KGTask(size=1, query_timeout=1)
    session, opening = await opened(task)
    entity = next(iter(task.items[0]["entities"]))
    relation = (await observe(session, call("get_relations", variable=entity))).split("[")[1].split(",")[0]
    await session.step(call("get_neighbors", variable=entity, relation=relation.strip("]")))
    for k in range(9):
        await session.step(call("intersection", variable1=f"#{k}", variable2=f"#{k}"))
    assert await observe(session, call("get_relations", variable="#9")) == \
        "Error processing tool call: the query ran past its bound of 1 s and was stopped"
    assert (await observe(session, call("get_relations", variable=entity))).startswith("Observation: [")
    done = await session.step(say("Final Answer: #9"))  # an answer too costly to compute is no answer
    assert done.status == SampleStatus.AGENT_VALIDATION_FAILED
    await task.teardown()
