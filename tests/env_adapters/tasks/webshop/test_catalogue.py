"""WebShop catalogues: upstream's files (a sample written here) read and served, the generator, the search."""

from __future__ import annotations

import json
import random

import pytest

from env_adapters.task import get_task_class
from env_adapters.tasks.webshop import WebShopTask
from env_adapters.tasks.webshop.catalogue import DUMMY_ATTRIBUTE, Catalogue, parse_pricing
from env_adapters.tasks.webshop.generator import (
    GeneratorConfig,
    generate_catalogue,
    generate_raw,
    preset,
    write_files,
)
from env_adapters.tasks.webshop.search import SearchEngine


def raw_item(asin, name, pricing="$10.99", query="running shoes", options=None, **extra):
    return {"asin": asin, "name": name, "full_description": f"{name} description.", "small_description": ["Feature"],
            "pricing": pricing, "customization_options": options, "images": ["http://img"], "category": "fashion",
            "query": f" {query.upper()} ", "product_category": "Clothing › Shoes › Running", **extra}


def write_sample(directory):
    """A few records in upstream's formats, with the oddities upstream's loader handles."""
    items = [
        raw_item("B000000001", "Trail Running Shoes", "$40.00 - $60.00",
                 options={"Color": [{"value": "Black/White", "image": "u"}, {"value": " Navy ", "image": None}],
                          "Size": None}),
        raw_item("B000000002", "Road Running Shoes", "$1,250.50"),
        raw_item("B000000001", "Duplicate of the first"),  # dropped: ASIN seen
        raw_item("nan", "No ASIN"),  # dropped
        raw_item("B0000000031", "ASIN too long"),  # dropped
        raw_item("B000000004", "Kids Shoes", "", small_description="Single feature"),
    ]
    attributes = {"B000000001": {"attributes": ["non slip", "breathable mesh"]}, "B000000002": {}}
    human = {
        "B000000001": [
            {"instruction": "i want non slip running shoes in black.", "instruction_attributes": ["non slip"],
             "instruction_options": ["black | white"]},
            {"instruction": "skipped: no attributes", "instruction_attributes": [], "instruction_options": []},
        ],
        "B000000002": [{"instruction": "road shoes", "instruction_attributes": ["road"], "instruction_options": []}],
    }
    for name, data in (("items_shuffle.json", items), ("items_ins_v2.json", attributes),
                       ("items_human_ins.json", human)):
        (directory / name).write_text(json.dumps(data))
    return directory


def test_parse_pricing():
    assert parse_pricing("$12.99") == ([12.99], "$12.99")
    assert parse_pricing("$10.99 - $19.99") == ([10.99, 19.99], "$10.99 to $19.99")
    assert parse_pricing("$1,299.00") == ([1299.0], "$1299.0")
    assert parse_pricing(None) == ([100.0], "$100.0") == parse_pricing("")
    with pytest.raises(ValueError, match="pricing"):
        parse_pricing("free")


def test_loader_reads_upstream_files(tmp_path):
    catalogue = Catalogue.load(write_sample(tmp_path), seed=3)
    assert [p.asin for p in catalogue.products] == ["B000000001", "B000000002", "B000000004"]
    first, second, third = catalogue.products
    assert first.options == {"color": ["black | white", "navy"]}  # lower case, "/" shown as " | ", None dropped
    assert (first.pricing, first.price_tag, first.query) == ([40.0, 60.0], "$40.0 to $60.0", "running shoes")
    assert 40.0 <= catalogue.prices["B000000001"] <= 60.0  # a range product's price is drawn from its range
    assert (second.attributes, third.attributes) == ([DUMMY_ATTRIBUTE], [DUMMY_ATTRIBUTE])
    assert third.bullet_points == ["Single feature"] and third.price_tag == "$100.0"
    assert sorted(g.instruction_text.split(",")[0] for g in catalogue.goals) == [
        "i want non slip running shoes in black", "road shoes"]  # the goal without attributes is skipped
    goal = next(g for g in catalogue.goals if g.asin == "B000000001")
    price = catalogue.prices["B000000001"]
    assert goal.price_upper in [p for p in (10.0 * i for i in range(1, 100)) if p > price][1:4]
    assert goal.instruction_text.endswith(f", and price lower than {goal.price_upper:.2f} dollars")
    assert (goal.attributes, goal.goal_options, goal.name) == (["non slip"], ["black | white"], "Trail Running Shoes")
    again = Catalogue.load(tmp_path, seed=3)
    assert [g.instruction_text for g in again.goals] == [g.instruction_text for g in catalogue.goals]
    assert len(Catalogue.load(tmp_path, num_products=1).products) == 1


def test_loader_names_missing_files(tmp_path):
    (tmp_path / "items_shuffle.json").write_text("[]")
    with pytest.raises(FileNotFoundError, match="items_ins_v2.json"):
        Catalogue.load(tmp_path)


async def test_task_serves_upstream_files(tmp_path, tool_call):
    task = get_task_class("webshop")(catalogue=str(write_sample(tmp_path)), max_rounds=5)
    assert task.indices() == [0, 1]
    index = next(i for i in task.indices() if task.goal(i).asin == "B000000001")
    session = await task.start_session(index)
    session.reset()
    result = session.step(tool_call("search_action", keywords="trail running shoes"))
    assert "B000000001 [SEP] Trail Running Shoes [SEP] $40.0 to $60.0" in result.messages[0]["content"]
    session.step(tool_call("click_action", value="b000000001"))
    result = session.step(tool_call("click_action", value="black | white"))
    assert "color [SEP] black | white [SEP] navy [SEP] Trail Running Shoes" in result.messages[0]["content"]
    result = session.step(tool_call("click_action", value="buy now"))
    assert result.reward == 1.0 and result.metrics["purchased_target"]


def test_task_options_are_checked(tmp_path):
    for options, match in [({"preset": "tiny"}, "unknown preset"), ({"generator": {"size": 3}}, "unknown generator"),
                           ({"generator": {"products": 10, "goals": 20}}, "products must be"),
                           ({"max_rounds": 0}, "max_rounds"),
                           ({"catalogue": str(tmp_path / "nope"), "preset": "standard"}, "directory"),
                           ({"num_products": 5}, "num_products"), ({"start": 5, "end": 5}, "start < end")]:
        with pytest.raises(ValueError, match=match):
            WebShopTask(**{"preset": "easy", **options})
    with pytest.raises(ValueError, match="held_out"):
        GeneratorConfig(goals=5, held_out=6, products=100)


def test_generator_is_seeded_and_splits_goals():
    config = preset("standard", products=900, goals=200, held_out=50, distractors=3)
    catalogue = generate_catalogue(config, seed=1)
    assert len(catalogue.products) == 900 and len(catalogue.goals) == 200
    assert len({g.asin for g in catalogue.goals}) == 200  # every goal has its own target
    assert generate_catalogue(config, seed=1).goals == catalogue.goals
    assert generate_catalogue(config, seed=2).goals != catalogue.goals
    _, _, _, held_out = generate_raw(config, seed=1)
    assert {g.asin for g in catalogue.goals[:50]} == set(held_out)  # held-out goals come first
    for goal in catalogue.goals:
        target = catalogue.by_asin[goal.asin]
        assert set(goal.attributes) <= set(target.attributes) and len(goal.attributes) == 2
        assert all(any(o in values for values in target.options.values()) for o in goal.goal_options)
        assert goal.price_upper > catalogue.prices[goal.asin] and goal.query in goal.instruction_text


def test_written_files_load_as_upstream_files(tmp_path):
    config = preset("easy", products=120, goals=100, held_out=20)
    write_files(tmp_path, config, seed=4)
    loaded = Catalogue.load(tmp_path, seed=4)
    generated = generate_catalogue(config, seed=4)
    assert [p.asin for p in loaded.products] == [p.asin for p in generated.products]
    assert sorted(g.instruction_text for g in loaded.goals) == sorted(g.instruction_text for g in generated.goals)


def test_search_ranks_like_lucene():
    catalogue = Catalogue.from_raw([
        raw_item("B000000001", "Trail Running Shoes"),
        raw_item("B000000002", "Running Shoe for Kids"),
        raw_item("B000000003", "Kitchen Knife Set", query="knife"),
        raw_item("B000000000", "Trail Running Shoes"),  # same text as the first: a tie, broken by ASIN
    ], {}, {})
    engine = SearchEngine(catalogue.products)
    assert engine.search("trail shoes", 10) == [3, 0, 1]  # "shoes" and "shoe" share the Porter stem
    assert engine.search("the knife", 10) == [2]  # stop word dropped
    assert engine.search("kid's shoe", 1) == [1]  # possessive removed
    assert engine.search("the of and", 10) == [] and engine.search("zzz", 10) == []  # no matching term, no hits


def test_generated_search_finds_targets_by_title():
    catalogue = generate_catalogue(preset("standard", products=2000, goals=100, held_out=20), seed=0)
    engine = SearchEngine(catalogue.products)
    index = {p.asin: i for i, p in enumerate(catalogue.products)}
    rng = random.Random(0)
    for goal in rng.sample(catalogue.goals, 30):
        assert index[goal.asin] in engine.search(catalogue.by_asin[goal.asin].name, 50)
