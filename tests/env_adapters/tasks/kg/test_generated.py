"""Generated kg questions: the generator's guarantees, the gold traces earning reward 1 on all 1,000 items of a
split (in process) and on a sample through the real controller and worker, and a wrong variable earning 0 with
its F1."""

from __future__ import annotations

import asyncio
import collections

import pytest

from env_adapters.client import EnvClient
from env_adapters.protocol import SampleStatus
from env_adapters.tasks.kg.expert import kg_expert, parse_action
from env_adapters.tasks.kg.generator import TEMPLATES, GeneratorConfig, generate_graph, generate_items
from env_adapters.tasks.kg.ontology import Ontology
from env_adapters.tasks.kg.sexpr import entities_of, parse
from env_adapters.tasks.kg.task import KGTask, f1, gold_answers

from .support import play

STACK_OPTIONS = {"seed": 3, "size": 200}
STACK_SAMPLE = range(0, 200, 5)


def test_generator_is_deterministic_and_well_formed(tmp_path):
    config = GeneratorConfig(seed=1)
    graph = generate_graph(config)
    items = generate_items(graph, config, 300)
    assert items == generate_items(generate_graph(GeneratorConfig(seed=1)), config, 300)
    assert items != generate_items(generate_graph(GeneratorConfig(seed=2)), GeneratorConfig(seed=2), 300)
    assert len({i["s_expression"] for i in items}) == 300
    assert set(collections.Counter(i["template"] for i in items)) == set(TEMPLATES)
    for item in items:
        assert set(item["entities"].values()) == entities_of(parse(item["s_expression"]))
        assert all(graph.names[mid] == name for name, mid in item["entities"].items())
        assert item["answer"] and not gold_answers(item) & set(item["entities"].values())
        for action in item["actions"]:
            parse_action(action)
    hops = collections.Counter(i["s_expression"].count("(R ") for i in items if i["template"] == "join")
    assert set(hops) == {1, 2}
    assert all(r.count(".") == 2 for r in graph.ontology.relations)  # domain.type.property
    assert any(".related_topics" in r for r in graph.ontology.relations)  # distractors
    assert Ontology.load(graph.ontology.save(tmp_path)) == graph.ontology
    easy = GeneratorConfig.preset("easy")
    easy_items = generate_items(generate_graph(easy), easy, 200)
    assert {i["template"] for i in easy_items} == {"join"} and all(len(i["actions"]) == 2 for i in easy_items)
    with pytest.raises(ValueError, match="could not make"):
        tiny = GeneratorConfig(entities_per_type=4, types=2, templates=("join",), max_hops=1, distractors=0)
        generate_items(generate_graph(tiny), tiny, 500)


@pytest.mark.parametrize("options", [{}, {"preset": "easy", "prompt": "short"}])
async def test_gold_traces_earn_reward_on_a_full_split(options):
    task = KGTask(size=1000, **options)
    await task.setup()
    try:
        results = [await play(task, i) for i in task.indices()]
    finally:
        await task.teardown()
    assert collections.Counter(r.reward for r, _ in results) == {1.0: 1000}
    assert all(r.status is SampleStatus.COMPLETED and r.metrics["score"] == 1.0 for r, _ in results)
    assert all(r.metrics["tool_errors"] == 0 for r, _ in results)


async def test_wrong_variable_earns_zero_with_its_f1():
    """Answering #0 (the first side of an intersection) instead of the intersection."""
    task = KGTask(size=200)
    graph = generate_graph(task.config)

    def answer_first(task, index, messages):
        message = kg_expert(task, index, messages)
        return message if "tool_calls" in message else {"role": "assistant", "content": "Final Answer: #0"}

    await task.setup()
    try:
        checked = 0
        for index, item in enumerate(task.items):
            if item["template"] != "and" or not item["actions"][2].startswith("get_relations(m."):
                continue  # only intersections whose first side is one hop from a topic entity
            first = parse_action(item["actions"][1])[1]["relation"]
            topic = parse_action(item["actions"][0])[1]["variable"]
            members = graph.neighbors({topic}, first) - {topic}
            result, _ = await play(task, index, answer_first)
            assert result.status is SampleStatus.COMPLETED
            assert result.reward == float(members == gold_answers(item))
            assert result.metrics["score"] == pytest.approx(f1(members, gold_answers(item)))
            checked += result.reward == 0.0 and result.metrics["score"] > 0
        assert checked >= 5
    finally:
        await task.teardown()


async def test_gold_traces_through_controller_and_worker(env_stack):
    stack = env_stack("kg", options=STACK_OPTIONS, concurrency=8)
    local = KGTask(**STACK_OPTIONS)  # same options, same items: drives the expert

    async def episode(env: EnvClient, index: int) -> float:
        started = await env.start_sample("kg", index)
        messages = list(started.messages)
        while True:
            message = kg_expert(local, index, messages)
            messages.append(message)
            reply = await env.interact(started.session_id, message)
            messages.extend(reply.messages)
            if reply.finish:
                assert reply.status is SampleStatus.COMPLETED and reply.metrics["score"] == reply.reward
                return reply.reward

    async with EnvClient(stack.url) as env:
        assert await env.get_indices("kg") == list(range(200))
        rewards = await asyncio.gather(*(episode(env, i) for i in STACK_SAMPLE))
    assert rewards == [1.0] * len(STACK_SAMPLE)
