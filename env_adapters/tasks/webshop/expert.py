"""A scripted WebShop expert: search the instruction, open a product that fully satisfies the goal, choose the
goal's options, buy.

It reads the page from the last environment message (its ``Available Actions`` dictionary) and its own earlier
actions, and knows the goal from the task, as a demonstrator does:

1. on the search page, search the instruction (without its price clause), or, when that search showed no
   satisfying product within its pages, the target's title;
2. on a results page, open the first listed product that earns reward 1 with the goal's options (the target
   always does), else ``Next >``, else ``Back to Search`` (to search again);
3. on the product's page, click each goal option value not yet chosen, then ``Buy Now``.
"""

from __future__ import annotations

import ast
import json
import re

from env_adapters.protocol import Index, Message
from env_adapters.task import Task
from env_adapters.tasks.webshop.catalogue import Goal
from env_adapters.tasks.webshop.engine import parse_action
from env_adapters.tasks.webshop.reward import get_reward

_ACTIONS = re.compile(r"Available Actions:\n(\{.*\})\s*$", re.S)
_PRICE_CLAUSE = re.compile(r", and price lower than [\d.]+ dollars$")


def _call(name: str, argument_name: str, value: str, turn: int) -> Message:
    arguments = json.dumps({argument_name: value})
    return {"role": "assistant", "content": "",
            "tool_calls": [{"id": f"call_{turn}", "type": "function",
                            "function": {"name": name, "arguments": arguments}}]}


def _my_actions(messages: list[Message]) -> list[str]:
    """The ``search[...]``/``click[...]`` actions of the assistant's earlier messages, in order."""
    actions = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            function = m["tool_calls"][0]["function"]
            value = next(iter(json.loads(function["arguments"]).values()))
            actions.append(f"{'search' if function['name'] == 'search_action' else 'click'}[{value}]")
    return actions


def _satisfies(task: Task, goal: Goal, asin: str) -> bool:
    """Whether buying ``asin`` with the goal's option values earns reward 1."""
    product = task.shop.catalogue.by_asin[asin]
    options = {name: o for o in goal.goal_options for name, values in product.options.items() if o in values}
    return get_reward(product, goal, task.shop.catalogue.prices[asin], options, task.shop.nouns)[0] >= 1.0


def expert(task: Task, index: Index, messages: list[Message]) -> Message:
    """The next assistant message of the scripted expert on ``task``'s goal ``index`` (see the module doc)."""
    goal = task.goal(index)
    page = next(m["content"] for m in reversed(messages) if m["role"] in ("user", "tool") and
                _ACTIONS.search(m["content"]))
    clickables = ast.literal_eval(_ACTIONS.search(page).group(1))["clickables"]
    actions = _my_actions(messages)
    turn = len(actions)
    if clickables == ["search"]:
        searched = any(parse_action(a)[0] == "search" for a in actions)
        keywords = task.shop.catalogue.by_asin[goal.asin].name if searched else \
            _PRICE_CLAUSE.sub("", goal.instruction_text)
        return _call("search_action", "keywords", keywords, turn)
    if "buy now" in clickables:  # a product page opened by the expert: options chosen since, then buy
        opened = max(i for i, a in enumerate(actions) if parse_action(a)[1].upper() in task.shop.catalogue.by_asin)
        chosen = {parse_action(a)[1] for a in actions[opened + 1:]}
        missing = [o for o in goal.goal_options if o not in chosen and o in clickables]
        return _call("click_action", "value", missing[0] if missing else "Buy Now", turn)
    listed = [c.upper() for c in clickables if c.upper() in task.shop.catalogue.by_asin]
    good = [asin for asin in listed if _satisfies(task, goal, asin)]
    if good:
        return _call("click_action", "value", good[0], turn)
    if "next >" in clickables:
        return _call("click_action", "value", "Next >", turn)
    return _call("click_action", "value", "Back to Search", turn)
