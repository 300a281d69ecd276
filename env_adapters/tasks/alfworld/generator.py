"""Seeded ALFWorld games in the engine's own format (``game.tw-pddl``), built from the data bundled with ``alfworld``.

A game is one of ALFWorld's 120 floor plans (its receptacles, from the layout tables), objects of the scene's types
placed in receptacles that can hold them (ALFRED's receptacle/object table), and a goal of one of the six task types
from ALFRED's goal library, with its templated description. Games are solvable by construction: the objects the goal
needs exist and sit in receptacles the agent can reach, and the needed appliance (sink basin, microwave, fridge,
lamp) is there. Each game carries the commands that win it (``walkthrough``, the key TextWorld reads a game's
walkthrough from), written with the game, as short as the planner's. Held-out games use ALFRED's unseen floor plans
(:data:`HELD_OUT_FLOOR_PLANS`), training games the others.

The engine's grammar in ``alfworld`` 0.4.2 says "move X to Y" where AgentBench's games say "put X in/on Y"; the
grammar written into each game uses upstream's wording.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import SimpleNamespace
from typing import Any

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# ALFRED's valid_unseen scenes (ALFWorld's out-of-distribution games): one kitchen, living room, bedroom, bathroom.
HELD_OUT_FLOOR_PLANS = frozenset({10, 219, 308, 424})
SPLITS = ("train", "test")
_ROOMS = {"Kitchen": range(1, 31), "LivingRoom": range(201, 231), "Bedroom": range(301, 331),
          "Bathroom": range(401, 431)}
_APPLIANCE = {"pick_clean_then_place_in_recep": "SinkBasin", "pick_heat_then_place_in_recep": "Microwave",
              "pick_cool_then_place_in_recep": "Fridge"}
_VERBS = {"SinkBasin": "clean", "Microwave": "heat", "Fridge": "cool"}  # the appliances' commands
_PROPERTY = {"pick_clean_then_place_in_recep": "Cleanable", "pick_heat_then_place_in_recep": "Heatable",
             "pick_cool_then_place_in_recep": "Coolable"}
_PROPERTY_FACTS = {"Cleanable": "cleanable", "Heatable": "heatable", "Coolable": "coolable",
                   "Sliceable": "sliceable", "Toggleable": "toggleable"}
_LAMPS = ("DeskLamp", "FloorLamp")
_WORDING = [  # (0.4.2's text, AgentBench's)
    ('template :: "move {o} to {r}";', 'template :: "put {o} in/on {r}";'),
    ('"You move the {o.name} to the {r.name}."', '"You put the {o.name} in/on the {r.name}."'),
    ("move (object) to (receptacle):  place", "put (object) in/on (receptacle): place"),
]


@dataclass(frozen=True)
class Difficulty:
    """Knobs of generated games.

    Attributes:
        task_types: Task types drawn from (index ``i`` gets ``task_types[i % len(task_types)]``).
        max_receptacles: Most receptacles in a room (those the task needs are always kept); ``None``: the whole
            floor plan (5 to 40 receptacles).
        distractors: Objects placed besides those the task needs.
    """

    task_types: tuple[str, ...] = TASK_TYPES
    max_receptacles: int | None = None
    distractors: int = 10

    def __post_init__(self) -> None:
        unknown = sorted(set(self.task_types) - set(TASK_TYPES))
        if not self.task_types or unknown:
            raise ValueError(f"alfworld: task_types must be a non-empty subset of {list(TASK_TYPES)}, got "
                             f"{list(self.task_types)}")
        if self.max_receptacles is not None and self.max_receptacles < 3:
            raise ValueError(f"alfworld: max_receptacles must be >= 3 (or null for whole rooms), got "
                             f"{self.max_receptacles}")
        if self.distractors < 0:
            raise ValueError(f"alfworld: distractors must be >= 0, got {self.distractors}")


# ---- the bundled tables ----------------------------------------------------------------------------


def _mangle(name: str) -> str:
    """ALFRED's PDDL spelling of a THOR object id (``Cabinet|+00.65|...`` -> ``Cabinet_bar__plus_00_dot_65...``)."""
    for char, word in (("|", "_bar_"), ("-", "_minus_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        name = name.replace(char, word)
    return name


@dataclass(frozen=True)
class FloorPlan:
    number: int
    room: str
    receptacles: tuple[tuple[str, str], ...]  # (THOR id, type)
    objects: frozenset[str]  # object types in the scene


@cache
def floor_plans() -> dict[int, FloorPlan]:
    """The 120 floor plans of ``alfworld/gen/layouts``, by number."""
    layouts = resources.files("alfworld.gen") / "layouts"
    plans = {}
    for room, numbers in _ROOMS.items():
        for number in numbers:
            openable = json.loads((layouts / f"FloorPlan{number}-openable.json").read_text())
            objects = json.loads((layouts / f"FloorPlan{number}-objects.json").read_text())
            receptacles = tuple(sorted((key, key.split("|")[-1] if key.count("|") == 4 else key.split("|")[0])
                                       for key in openable))
            plans[number] = FloorPlan(number, room, receptacles, frozenset(objects))
    return plans


@cache
def _tables() -> tuple[dict[str, set[str]], dict[str, set[str]], frozenset[str], dict[str, Any], str, str]:
    from alfworld.gen import constants, goal_library

    data = resources.files("alfworld") / "data"
    grammar = (data / "alfred.twl2").read_text()
    for old, new in _WORDING:
        if old not in grammar:
            raise RuntimeError(f"alfworld's grammar no longer contains {old!r}; update the wording fix-up")
        grammar = grammar.replace(old, new)
    holds = {r: set(objs) for r, objs in constants.VAL_RECEPTACLE_OBJECTS.items()}
    pickupable = set().union(*holds.values()) - set(_LAMPS)
    return (holds, {k: set(v) for k, v in constants.VAL_ACTION_OBJECTS.items()}, frozenset(pickupable),
            goal_library.gdict, grammar, (data / "alfred.pddl").read_text())


# ---- one game --------------------------------------------------------------------------------------


def _containers(receptacles: list[tuple[str, str]], obj: str, holds: dict[str, set[str]],
                exclude_type: str | None = None) -> list[str]:
    return [rid for rid, rtype in receptacles if obj in holds.get(rtype, ()) and rtype != exclude_type]


def _sample(rng: random.Random, task_type: str, plans: list[FloorPlan], difficulty: Difficulty):
    """Pick a floor plan and the goal's arguments; ``None`` when this draw cannot host the task."""
    holds, actions, pickupable, *_ = _tables()
    plan = rng.choice(plans)
    rtypes = sorted({rtype for _, rtype in plan.receptacles})
    candidates = sorted(plan.objects & pickupable)
    appliance = _APPLIANCE.get(task_type)
    if appliance and appliance not in rtypes:
        return None
    if task_type in _PROPERTY:
        candidates = [o for o in candidates if o in actions[_PROPERTY[task_type]]]
    if task_type == "look_at_obj_in_light":
        lamps = [lamp for lamp in _LAMPS if lamp in plan.objects]
        stands = [rid for rid, rtype in plan.receptacles if rtype not in ("Fridge", "Microwave", "SinkBasin",
                                                                          "BathtubBasin", "GarbageCan")]
        if not lamps or not stands or not candidates:
            return None
        obj = rng.choice(candidates)
        sources = _containers(list(plan.receptacles), obj, holds)
        if not sources:
            return None
        return plan, {"obj": obj, "toggle": rng.choice(lamps), "recep": "", "mrecep": ""}, \
            [(obj, rng.choice(sources))], [rng.choice(stands)]
    pairs = [(o, r) for o in candidates for r in rtypes if o in holds.get(r, ()) and r != appliance
             and _containers(list(plan.receptacles), o, holds, exclude_type=r)]
    if not pairs:
        return None
    obj, recep = rng.choice(pairs)
    sources = _containers(list(plan.receptacles), obj, holds, exclude_type=recep)
    count = 2 if task_type == "pick_two_obj_and_place" else 1
    return plan, {"obj": obj, "recep": recep, "toggle": "", "mrecep": ""}, \
        [(obj, rng.choice(sources)) for _ in range(count)], []


def generate(seed: int, split: str, index: int, difficulty: Difficulty) -> dict[str, Any]:
    """The ``game.tw-pddl`` content of game ``index`` (deterministic in all arguments).

    Raises:
        ValueError: unknown split.
    """
    if split not in SPLITS:
        raise ValueError(f"alfworld: split must be one of {list(SPLITS)}, got {split!r}")
    holds, actions, pickupable, goals, grammar, domain = _tables()
    task_type = difficulty.task_types[index % len(difficulty.task_types)]
    rooms = {"pick_and_place_simple": _ROOMS, "pick_two_obj_and_place": _ROOMS}.get(task_type)
    plans = [p for p in floor_plans().values() if (p.number in HELD_OUT_FLOOR_PLANS) == (split == "test")
             and (rooms is not None or p.room in _valid_rooms(task_type))]
    rng = random.Random(f"alfworld:{seed}:{split}:{index}")
    drawn = None
    while drawn is None:  # a few draws at most: most floor plans host most tasks
        drawn = _sample(rng, task_type, plans, difficulty)
    plan, params, placed, lamp_stands = drawn

    # The room: the receptacles the task needs, then others up to max_receptacles.
    needed = {rid for _, rid in placed} | set(lamp_stands)
    chosen = {}  # the receptacle of each type the task needs: the goal's receptacle, the appliance
    for rtype in (params["recep"], _APPLIANCE.get(task_type)):
        of_type = [rid for rid, t in plan.receptacles if t == rtype]
        if of_type:
            chosen[rtype] = rng.choice(of_type)
            needed.add(chosen[rtype])
    others = [r for r in plan.receptacles if r[0] not in needed]
    rng.shuffle(others)
    room = [r for r in plan.receptacles if r[0] in needed]
    budget = len(plan.receptacles) if difficulty.max_receptacles is None else difficulty.max_receptacles
    room = sorted(room + others[:max(0, budget - len(room))])
    lamp = None
    if lamp_stands:
        lamp, placed = len(placed), placed + [(params["toggle"], lamp_stands[0])]
    scene_objects = sorted(plan.objects & pickupable - {params["obj"]})
    for _ in range(difficulty.distractors):
        if not scene_objects:
            break
        obj = rng.choice(scene_objects)
        where = _containers(room, obj, holds)
        if where:
            placed.append((obj, rng.choice(where)))

    goal_text = rng.choice(goals[task_type]["templates"]).format(
        **{k: v.lower() for k, v in params.items()})
    problem = _problem(f"{task_type}_{seed}_{split}_{index}", room, placed,
                       goals[task_type]["pddl"].format(**params).replace("#", "-"))
    walkthrough = _walkthrough(task_type, room, placed, chosen.get(params["recep"]),
                               chosen.get(_APPLIANCE.get(task_type)), lamp)
    return {"pddl_domain": domain, "grammar": grammar.replace("UNKNOWN GOAL", goal_text), "pddl_problem": problem,
            "solvable": True, "walkthrough": walkthrough, "task_type": task_type, "floor_plan": plan.number}


@cache
def _valid_rooms(task_type: str) -> frozenset[str]:
    from alfworld.gen import constants

    return frozenset(constants.GOALS_VALID[task_type])


def _object_id(otype: str, i: int) -> str:
    """The THOR id of the ``i``-th placed object."""
    return f"{otype}|+{i:02d}.00|+00.00|+00.00"


def _walkthrough(task_type: str, room: list[tuple[str, str]], placed: list[tuple[str, str]], target: str | None,
                 appliance: str | None, lamp: int | None) -> list[str]:
    """The commands that win the game, as the engine spells them: the goal's objects are the first ``placed``,
    ``lamp`` indexes the lamp to turn on (look_at_obj_in_light); openable receptacles start closed.

    Written by construction: TextWorld's planner searches without a heuristic (uniform cost), 0.07 s of CPU on the
    median whole-room game but up to 7 s (60 games), in the process that asks for the walkthrough.
    """
    from alfworld.agents.utils.misc import Demangler
    from alfworld.gen import constants

    # The engine's names: ALFWorld's demangler over the ids as Fast Downward spells them (lower case).
    ids = {rid: _mangle(rid).lower() for rid, _ in room}
    ids.update({(otype, i): _mangle(_object_id(otype, i)).lower() for i, (otype, _) in enumerate(placed)})
    demangler = Demangler(game_infos={v: SimpleNamespace(id=v) for v in ids.values()})
    name = {key: demangler.demangle_alfred_name(v).strip() for key, v in ids.items()}
    openable = {rid for rid, rtype in room if rtype in constants.OPENABLE_CLASS_SET}

    steps: list[str] = []
    at, opened = None, set()

    def go(rid: str, open_it: bool = False) -> None:
        nonlocal at
        if at != rid:
            steps.append(f"go to {name[rid]}")
            at = rid
        if open_it and rid in openable and rid not in opened:
            steps.append(f"open {name[rid]}")
            opened.add(rid)

    count = 2 if task_type == "pick_two_obj_and_place" else 1
    for i, (otype, source) in enumerate(placed[:count]):
        obj = name[(otype, i)]
        go(source, open_it=True)
        steps.append(f"take {obj} from {name[source]}")
        if appliance is not None:
            go(appliance)
            steps.append(f"{_VERBS[dict(room)[appliance]]} {obj} with {name[appliance]}")
        if lamp is not None:
            go(placed[lamp][1])
            steps.append(f"use {name[(placed[lamp][0], lamp)]}")
        if target is not None:
            go(target, open_it=True)
            steps.append(f"put {obj} in/on {name[target]}")
    return steps


def _problem(name: str, room: list[tuple[str, str]], placed: list[tuple[str, str]], goal: str) -> str:
    """A PDDL problem of the ALFRED domain: the agent in the middle of the room, each receptacle at its own
    location, each object in its receptacle."""
    holds, actions, *_ = _tables()
    from alfworld.gen import constants

    location = {rid: f"loc_bar_{i}_bar_0_bar_0_bar_0" for i, (rid, _) in enumerate(room)}
    rtype_of = dict(room)
    objects, init = ["agent1 - agent", "loc_bar_start_bar_0_bar_0_bar_0 - location"], [
        "(atLocation agent1 loc_bar_start_bar_0_bar_0_bar_0)"]
    for rid, rtype in room:
        r = _mangle(rid)
        objects += [f"{r} - receptacle", f"{location[rid]} - location"]
        init += [f"(receptacleType {r} {rtype}Type)", f"(receptacleAtLocation {r} {location[rid]})"]
        if rtype in constants.OPENABLE_CLASS_SET:
            init.append(f"(openable {r})")
    for i, (otype, rid) in enumerate(placed):
        o = _mangle(_object_id(otype, i))
        objects.append(f"{o} - object")
        init += [f"(objectType {o} {otype}Type)", f"(inReceptacle {o} {_mangle(rid)})",
                 f"(objectAtLocation {o} {location[rid]})"]
        if otype not in _LAMPS:
            init.append(f"(pickupable {o})")
        if otype in constants.MOVABLE_RECEPTACLES_SET:
            init.append(f"(isReceptacleObject {o})")
        init += [f"({fact} {o})" for prop, fact in _PROPERTY_FACTS.items() if otype in actions[prop]]
    otypes = sorted({otype for otype, _ in placed})
    rtypes = sorted(set(rtype_of.values()))
    objects += [f"{t}Type - otype" for t in otypes] + [f"{t}Type - rtype" for t in rtypes]
    init += [f"(canContain {r}Type {o}Type)" for r in rtypes for o in otypes if o in holds.get(r, ())]
    return ("(define (problem {})\n(:domain alfred)\n(:objects\n    {}\n)\n(:init\n    {}\n)\n{}".format(
        name, "\n    ".join(objects), "\n    ".join(init), goal.strip()))
