"""The ``alfworld`` task on the real TextWorld engine, sessions driven directly: upstream's action handling and
episode ends, the generator's splits and knobs, and a game file in upstream's ``json_2.1.1`` layout."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("alfworld")

from env_adapters.protocol import SampleStatus  # noqa: E402
from env_adapters.task import TaskError, get_task_class  # noqa: E402
from env_adapters.tasks.alfworld import agentbench  # noqa: E402
from env_adapters.tasks.alfworld.engine import Game  # noqa: E402
from env_adapters.tasks.alfworld.expert import expert  # noqa: E402
from env_adapters.tasks.alfworld.generator import HELD_OUT_FLOOR_PLANS, TASK_TYPES, Difficulty, generate  # noqa: E402
from env_adapters.tasks.alfworld.task import ALFWorldTask  # noqa: E402

EASY = {"task_types": ["pick_and_place_simple"], "max_receptacles": 3, "distractors": 0}


def call(action, call_id="c1", name="take_action"):
    function = {"name": name, "arguments": json.dumps({"action": action})}
    return {"role": "assistant", "content": "", "tool_calls": [{"id": call_id, "type": "function",
                                                                "function": function}]}


@pytest.fixture(scope="module")
def easy():
    return ALFWorldTask(size=20, **EASY)


async def session_of(task, index):
    session = await task.start_session(index)
    opening = session.reset()
    return session, opening


def play(task, index, session, messages, moves):
    """Send the expert's moves ``moves`` times; returns the last result."""
    result = None
    for _ in range(moves):
        message = expert(task, index, messages)
        result = session.step(message)
        messages += [message, *result.messages]
    return result


def test_process_action_is_upstreams():
    choices = ["go to cabinet 1", "go to cabinet 2", "open fridge 1", "take apple 1 from countertop 1"]
    assert agentbench.process_action("  Go to Cabinet 2\nbecause", choices) == "go to cabinet 2"
    assert agentbench.process_action("take the apple 1 from countertop 1", choices) == "take apple 1 from countertop 1"
    assert agentbench.process_action("dance", choices) == "dance"  # no overlap: unchanged, the engine refuses it
    assert agentbench.process_action("Anything", []) == "anything"
    with pytest.raises(AttributeError):
        agentbench.process_action(3, choices)


def test_only_the_head_of_an_overlong_action_is_read():
    choices = ["go to cabinet 1", "open fridge 1"]
    # What is scored and sent on is bounded (a 3.9 MB action was BLEU-scored whole against every command).
    assert len(agentbench.process_action("dance " * 700_000, choices)) == agentbench.MAX_ACTION_CHARS
    assert agentbench.process_action("go to cabinet 1 " + "x" * 4_000_000, choices) == "go to cabinet 1"


async def test_reset_shows_upstreams_prompt_and_tool(easy):
    session, opening = await session_of(easy, 0)
    try:
        system, user = opening.messages
        assert system == {"role": "system", "content": agentbench.INSTRUCTION}
        assert user["content"].startswith("Here is your task. You are in the middle of a room.")
        assert "Your task is to: put " in user["content"] and " AVAILABLE ACTIONS: go to " in user["content"]
        assert "Welcome to TextWorld" not in user["content"]
        assert [t["function"]["name"] for t in opening.tools] == ["take_action"]
        assert opening.status is SampleStatus.RUNNING
    finally:
        session.close()


async def test_expert_wins_and_the_engine_speaks_upstreams_wording(easy):
    session, opening = await session_of(easy, 1)
    messages = list(opening.messages)
    plan = easy.walkthrough(1)
    assert any(step.startswith("put ") and " in/on " in step for step in plan)
    result = play(easy, 1, session, messages, len(plan))
    session.close()
    assert (result.status, result.reward, result.metrics["score"]) == (SampleStatus.COMPLETED, 1.0, 1.0)
    assert result.messages[0]["content"].startswith("You put the ")


async def test_invalid_command_gets_nothing_happens_and_the_episode_goes_on(easy):
    session, _ = await session_of(easy, 2)
    result = session.step(call("dance"))
    session.close()
    assert result.status is SampleStatus.RUNNING
    assert result.messages == [{"role": "tool", "tool_call_id": "c1", "content": result.messages[0]["content"]}]
    assert result.messages[0]["content"].startswith("Nothing happens. AVAILABLE ACTIONS: ")


async def test_bad_calls_get_upstreams_messages_and_a_win_keeps_their_status(easy):
    session, opening = await session_of(easy, 3)
    messages = list(opening.messages)
    no_call = session.step({"role": "assistant", "content": "go to cabinet 1"})
    assert no_call.messages == [{"role": "user", "content": agentbench.NO_TOOL_CALL}]
    bad = dict(call("x"), tool_calls=[{"id": "c", "type": "function",
                                      "function": {"name": "take_action", "arguments": "{not json"}}])
    assert session.step(bad).messages == [{"role": "user", "content": agentbench.INVALID_TOOL_CALL}]
    assert session.step(call(7)).messages[0]["content"] == agentbench.INVALID_TOOL_CALL  # not text
    as_object = dict(call("x"), tool_calls=[{"id": "c", "type": "function",  # upstream json.loads a string only
                                            "function": {"name": "take_action", "arguments": {"action": "look"}}}])
    assert session.step(as_object).messages == [{"role": "user", "content": agentbench.INVALID_TOOL_CALL}]
    result = play(easy, 3, session, messages, len(easy.walkthrough(3)))
    session.close()
    assert (result.status, result.reward) == (SampleStatus.AGENT_INVALID_ACTION, 1.0)
    assert result.metrics["rounds"] == 4 + len(easy.walkthrough(3))


def test_an_action_the_bleu_scoring_fails_on_goes_to_the_engine_as_it_is(monkeypatch):
    def broken(reference, candidate):
        raise ZeroDivisionError

    monkeypatch.setattr(agentbench, "bleu", broken)
    assert agentbench.process_action("Go To Cabnet 1", ["go to cabinet 1", "look"]) == "go to cabnet 1"


async def test_three_repeats_end_the_episode(easy):
    session, _ = await session_of(easy, 4)
    statuses = [session.step(call("look", call_id=f"c{i}")).status for i in range(4)]
    session.close()
    assert statuses == [SampleStatus.RUNNING] * 3 + [SampleStatus.AGENT_INVALID_ACTION]


async def test_a_session_keeps_only_the_actions_its_repeat_check_reads(easy):
    # A policy's huge actions are not kept round after round: at most the last three, however long the episode.
    session, _ = await session_of(easy, 5)
    for i in range(8):
        assert session.step(call(f"dance {i} " + "x" * 100_000, call_id=f"c{i}")).status is SampleStatus.RUNNING
    assert len(session.recent) == agentbench.REPEAT_LIMIT and session.executed == 8
    session.close()


async def test_round_limit():
    task = ALFWorldTask(size=2, max_step=2, **EASY)
    session, _ = await session_of(task, 0)
    first, second = session.step(call("look")), session.step(call("inventory"))
    session.close()
    assert first.status is SampleStatus.RUNNING
    assert (second.status, second.reward) == (SampleStatus.TASK_LIMIT_REACHED, 0.0)


def test_generator_is_seeded_and_keeps_held_out_floor_plans_apart():
    difficulty = Difficulty()
    assert generate(0, "train", 5, difficulty) == generate(0, "train", 5, difficulty)
    assert generate(0, "train", 5, difficulty) != generate(1, "train", 5, difficulty)
    train = [generate(0, "train", i, difficulty) for i in range(24)]
    test = [generate(0, "test", i, difficulty) for i in range(24)]
    assert not {g["floor_plan"] for g in train} & HELD_OUT_FLOOR_PLANS
    assert {g["floor_plan"] for g in test} <= HELD_OUT_FLOOR_PLANS
    assert [g["task_type"] for g in train[:6]] == list(TASK_TYPES)


async def test_short_prompt_replaces_upstreams_instruction():
    task = ALFWorldTask(size=4, prompt="short", **EASY)
    session, opening = await session_of(task, 0)
    try:
        assert opening.messages[0] == {"role": "system", "content": agentbench.SHORT_INSTRUCTION}
        assert opening.messages[1]["content"].startswith("Here is your task.")
    finally:
        session.close()


def test_generated_walkthroughs_win_in_as_few_steps_as_the_planners():
    for index in range(len(TASK_TYPES)):  # one game of each type, rooms small enough for the planner
        data = generate(0, "train", index, Difficulty(max_receptacles=4, distractors=3))
        game = Game(data)
        observation = game.reset()
        for command in data["walkthrough"]:
            assert command in observation.admissible_commands, (data["task_type"], command)
            observation = game.step(command)
        game.close()
        planner = Game({k: v for k, v in data.items() if k != "walkthrough"}, walkthrough=True)
        planner.reset()
        planner.close()
        assert observation.won and len(data["walkthrough"]) == len(planner.walkthrough), data["task_type"]


def test_easy_setting_is_small():
    for i in range(10):
        problem = generate(0, "train", i, Difficulty(**{**EASY, "task_types": ("pick_and_place_simple",)}))
        text = problem["pddl_problem"].split("(:init")[0]  # the :objects section
        assert text.count(" - receptacle") <= 3 and text.count(" - object") == 1, text


def test_bad_options_name_themselves():
    for options, word in [({"games": "web"}, "games"), ({"split": "valid"}, "split"), ({"max_step": 0}, "max_step"),
                          ({"task_types": ["juggle"]}, "task_types"), ({"max_receptacles": 1}, "max_receptacles"),
                          ({"distractors": -1}, "distractors"), ({"games": "files"}, "data_path"),
                          ({"prompt": "long"}, "prompt")]:
        with pytest.raises(ValueError, match=word):
            ALFWorldTask(**options)
    assert get_task_class("alfworld") is ALFWorldTask


async def test_bad_index(easy):
    for index in (20, -1, "3"):
        with pytest.raises(TaskError):
            await easy.start_session(index)


# A game in the structure of upstream's json_2.1.1 folders: game.tw-pddl beside its trajectory files, written
# with the wording of upstream's grammar ("put X in/on Y") and a hand-written problem.
UPSTREAM_GAME = "json_2.1.1/valid_unseen/pick_and_place_simple-Mug-None-Desk-308/trial_T20190909_210238_431966"
IDS = {  # THOR ids in ALFRED's PDDL spelling
    "DESK": "Desk_bar__minus_01_dot_50_bar__plus_00_dot_00_bar__plus_02_dot_10",
    "SHELF": "Shelf_bar__minus_02_dot_00_bar__plus_01_dot_20_bar__minus_00_dot_25",
    "MUG": "Mug_bar__minus_02_dot_05_bar__plus_01_dot_24_bar__minus_00_dot_30",
    "PEN": "Pen_bar__minus_01_dot_40_bar__plus_00_dot_78_bar__plus_02_dot_00",
}
PROBLEM = """(define (problem plan_trial_T20190909_210238_431966)
(:domain alfred)
(:objects
    agent1 - agent
    loc_bar__minus_1_bar_2_bar_0_bar_30 - location
    loc_bar__minus_3_bar_4_bar_3_bar_60 - location
    loc_bar__minus_5_bar_1_bar_2_bar_45 - location
    DESK - receptacle
    SHELF - receptacle
    MUG - object
    PEN - object
    MugType - otype
    PenType - otype
    DeskType - rtype
    ShelfType - rtype
)
(:init
    (atLocation agent1 loc_bar__minus_1_bar_2_bar_0_bar_30)
    (receptacleType DESK DeskType)
    (receptacleType SHELF ShelfType)
    (receptacleAtLocation DESK loc_bar__minus_3_bar_4_bar_3_bar_60)
    (receptacleAtLocation SHELF loc_bar__minus_5_bar_1_bar_2_bar_45)
    (objectType MUG MugType)
    (objectType PEN PenType)
    (inReceptacle MUG SHELF)
    (inReceptacle PEN DESK)
    (pickupable MUG)
    (pickupable PEN)
    (canContain DeskType MugType)
    (canContain DeskType PenType)
    (canContain ShelfType MugType)
    (canContain ShelfType PenType)
)
(:goal (and (exists (?r - receptacle) (exists (?o - object) (and (inReceptacle ?o ?r) (objectType ?o MugType)
    (receptacleType ?r DeskType))))))
)"""


def upstream_problem() -> str:
    problem = PROBLEM
    for short, thor in IDS.items():
        problem = problem.replace(short, thor)
    return problem



@pytest.fixture
def upstream_data(tmp_path):
    from importlib import resources

    data = resources.files("alfworld") / "data"
    grammar = (data / "alfred.twl2").read_text().replace('"move {o} to {r}"', '"put {o} in/on {r}"')
    folder = tmp_path / UPSTREAM_GAME
    folder.mkdir(parents=True)
    game = {"pddl_domain": (data / "alfred.pddl").read_text(), "solvable": True, "pddl_problem": upstream_problem(),
            "grammar": grammar.replace("UNKNOWN GOAL", "put a mug in desk")}
    (folder / "game.tw-pddl").write_text(json.dumps(game))
    (folder / "initial_state.pddl").write_text(game["pddl_problem"])
    (folder / "traj_data.json").write_text(json.dumps({"task_type": "pick_and_place_simple"}))
    index = tmp_path / "split.json"
    index.write_text(json.dumps({"pick_and_place": [f"{UPSTREAM_GAME}/game.tw-pddl"]}))
    return tmp_path, index


async def test_upstream_game_file_loads_and_plays(upstream_data):
    root, index = upstream_data
    task = ALFWorldTask(games="files", data_path=str(root), index_file=str(index))
    assert task.indices() == [0]
    session, opening = await session_of(task, 0)
    assert "you see a desk 1, and a shelf 1." in opening.messages[1]["content"]
    assert "Your task is to: put a mug in desk." in opening.messages[1]["content"]
    messages = list(opening.messages)
    for action in ["go to shelf 1", "take mug 1 from shelf 1", "go to desk 1"]:
        assert session.step(call(action)).status is SampleStatus.RUNNING
    result = session.step(call("put mug 1 in/on desk 1"))
    session.close()
    assert (result.status, result.reward) == (SampleStatus.COMPLETED, 1.0)
    assert task.walkthrough(0)[-1] == "put mug 1 in/on desk 1" and messages


def test_missing_game_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="20 game files are missing"):
        ALFWorldTask(games="files", data_path=str(tmp_path))
