"""Upstream WebShop's purchase reward (``web_agent_site/engine/goal.py: get_reward``).

``reward = r_type * (attribute matches + option matches + price ok) / (#attributes + #options + 1)``:

- attributes: a goal attribute matches when ``token_set_ratio`` with one of the product's attributes is > 85, or
  when it appears in the product's title, features or description;
- options: a goal option matches a chosen option with ``token_set_ratio > 85`` after colour normalisation;
- price: the sampled price is at most the goal's bound;
- type ``r_type``: 1.0, lowered to 0.5 when neither the scrape query matches, nor two levels of the product
  category, nor more than 20% of the goal title's nouns; 0.1 below 10% of the nouns; 0.0 with none.

Title nouns are what upstream's spaCy tagger marks ``NOUN``/``PROPN`` in a title, with AgentBench's model
(``en_core_web_lg``; upstream WebShop's own is ``en_core_web_sm``) where one is installed (:class:`TitleNouns`).
spaCy's English models are not on the package index, so where none is installed a rule stands in
(:func:`rule_nouns`): the title's words of two or more letters (split on anything else; ``'s`` dropped) minus
closed-class words (determiners, pronouns, prepositions, conjunctions, auxiliaries) and a list of common
adjectives. It is a weak stand-in (spaCy tags words such as "free" or "wireless" as nouns in titles where the rule
drops them), so ``title_score`` (and through it ``r_type``) can differ from upstream's. The metric
``nouns_by_spacy`` says which one scored a purchase.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from thefuzz import fuzz

from env_adapters.tasks.webshop.catalogue import Goal, Product

MATCH_THRESHOLD = 85
SPACY_MODELS = ("en_core_web_lg", "en_core_web_sm")  # AgentBench's WebShop loads the first, upstream's the second
NOUN_TAGS = ("PNOUN", "NOUN", "PROPN")  # upstream's test (``PNOUN`` is no spaCy tag; kept as upstream has it)

log = logging.getLogger(__name__)

# upstream web_agent_site/engine/normalize.py: the first of these contained in an option value replaces it.
COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue", "blush", "bordeaux",
    "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne", "charcoal", "cheetah", "chestnut",
    "chocolate", "christmas", "coffee", "cognac", "copper", "coral", "cranberry", "cream", "crystal", "dark", "denim",
    "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite", "grape", "graphite", "grass", "gray", "green",
    "grey", "heather", "indigo", "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac", "lime",
    "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha", "multicolor", "mushroom", "mustard",
    "natural", "navy", "nude", "olive", "orange", "peach", "pewter", "pink", "plum", "purple", "rainbow", "red",
    "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull", "slate", "steel", "stone",
    "stonewash", "sunflower", "tan", "taupe", "teal", "tiger", "turquoise", "violet", "walnut", "wheat", "white",
    "wine", "yellow",
)

_CLOSED_CLASS = frozenset("""
a an the this that these those my your his her its our their some any each every no all both either neither
i you he she it we they me him us them what which who whom whose
of in on at by for with without from to into onto over under above below between among through during about
against along around across behind beyond near off out up down upon within via per than like as
and or but nor so yet if because while although though unless
is are was were be been being am do does did have has had will would can could should may might must shall
not very too also just only more most less least
""".split())

_ADJECTIVES = frozenset("""
new best great good perfect premium professional quality high low long short large small big mini extra little
soft hard heavy light lightweight thin thick slim wide narrow deep flat round square full half double single
natural organic fresh healthy pure real genuine original classic modern vintage retro simple elegant cute
portable wireless waterproof durable adjustable compatible comfortable breathable reusable washable disposable
easy quick fast free safe clean dry wet warm cool cold hot sensitive smooth strong tough clear bright dark
black white red blue green yellow pink purple orange brown grey gray silver golden beige navy
old fashioned casual formal unisex outdoor indoor daily ultra super sturdy stylish lovely beautiful
""".split())

_POSSESSIVE = re.compile(r"['’]s\b")
_WORD = re.compile(r"[a-z]{2,}")


def normalize_color(value: str) -> str:
    """The first colour of upstream's ``COLOR_SET`` contained in ``value``, else ``value``."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def rule_nouns(title: str) -> list[str]:
    """Approximation of the nouns and proper nouns spaCy would tag in ``title`` (lower case, in order)."""
    words = _WORD.findall(_POSSESSIVE.sub(" ", title.lower()))
    return [w for w in words if w not in _CLOSED_CLASS and w not in _ADJECTIVES]


class TitleNouns:
    """The nouns of a title as upstream finds them (lower case, in order).

    Args:
        model: ``auto``: the first installed of :data:`SPACY_MODELS`, else :func:`rule_nouns` (logged at start);
            ``rule``: :func:`rule_nouns`; else the name or path of a spaCy pipeline that must load.

    Raises:
        ValueError: ``model`` names a spaCy pipeline that does not load (the message says how to install one).
    """

    def __init__(self, model: str = "auto") -> None:
        loaded = None if model == "rule" else _load_spacy(SPACY_MODELS if model == "auto" else (model,),
                                                          required=model != "auto")
        self._nlp, self.model = loaded or (None, "rule")
        if model == "rule":
            return
        if self._nlp is None:
            log.warning("webshop: no spaCy English model installed (%s): title nouns for r_type come from a rule, "
                        "which can differ from upstream's on real titles; install %s for upstream's",
                        ", ".join(SPACY_MODELS), SPACY_MODELS[0])
        else:
            log.info("webshop: title nouns from spaCy pipeline %s", self.model)

    def __call__(self, title: str) -> list[str]:
        if self._nlp is None:
            return rule_nouns(title)
        return [t.text.lower() for t in self._nlp(title) if t.pos_ in NOUN_TAGS]


def _load_spacy(names: tuple[str, ...], required: bool) -> tuple[Any, str] | None:
    """The first of ``names`` that spaCy loads, with its name; ``None`` when none does and none is ``required``."""
    try:
        import spacy
    except ImportError as e:
        if required:
            raise ValueError(f"webshop: title_nouns {names[0]!r} needs spaCy (pip install spacy)") from e
        return None
    for name in names:
        try:
            return spacy.load(name, disable=["parser", "ner", "lemmatizer"]), str(name)
        except OSError as e:
            if required:
                raise ValueError(f"webshop: title_nouns: spaCy pipeline {name!r} does not load ({e}); install it "
                                 f"(python -m spacy download {name}) or use title_nouns: auto | rule") from e
    return None


def type_reward(product: Product, goal: Goal, nouns: Callable[[str], list[str]] = rule_nouns) -> dict[str, Any]:
    """``r_type`` and what it is made of (upstream's ``get_type_reward``), with ``nouns`` finding title nouns."""
    query_match = product.query == goal.query
    purchased_category = {x.strip() for x in product.product_category.split("›")}
    goal_category = {x.strip() for x in goal.product_category.split("›")}
    category_match = len(purchased_category & goal_category) >= 2
    purchased_nouns, desired_nouns = set(nouns(product.name)), nouns(goal.name)
    if not desired_nouns:
        title_score = 0.2
    else:
        title_score = len(purchased_nouns & set(desired_nouns)) / len(desired_nouns)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match,
            "title_score": title_score, "nouns_by_spacy": getattr(nouns, "model", "rule") != "rule"}


def attribute_matches(product: Product, goal: Goal) -> int:
    """Goal attributes found among the product's attributes (fuzzy) or in its title, features or description."""
    title, bullets, description = (product.name.lower(), " ".join(product.bullet_points).lower(),
                                   product.description.lower())
    matches = 0
    for goal_attr in goal.attributes:
        if any(fuzz.token_set_ratio(attr, goal_attr) > MATCH_THRESHOLD for attr in product.attributes):
            matches += 1
        elif goal_attr in title or goal_attr in bullets or goal_attr in description:
            matches += 1
    return matches


def option_matches(chosen: list[str], goal_options: list[str]) -> int:
    """Goal options matched by a chosen option value (fuzzy, after colour normalisation)."""
    chosen = [normalize_color(o) for o in chosen]
    matches = 0
    for goal_option in (normalize_color(o) for o in goal_options):
        if any(fuzz.token_set_ratio(option, goal_option) > MATCH_THRESHOLD for option in chosen):
            matches += 1
    return matches


def get_reward(product: Product, goal: Goal, price: float, options: dict[str, str],
               nouns: Callable[[str], list[str]] = rule_nouns) -> tuple[float, dict[str, Any]]:
    """Reward (0-1) of buying ``product`` at ``price`` with the chosen ``options``, and its parts.

    The parts are upstream's verbose info: ``r_type``, ``r_att``, ``w_att``, ``query_match``, ``category_match``,
    ``title_score``, ``r_option``/``w_option`` (when the goal has options), ``r_price``/``w_price``; and
    ``nouns_by_spacy``, whether ``nouns`` (a :class:`TitleNouns`, else the rule) tagged with spaCy.
    """
    type_info = type_reward(product, goal, nouns)
    # Upstream skips the price term for a non-positive bound; bounds are a price or 1e6 here, always positive.
    r_price = price <= goal.price_upper
    n_attrs = attribute_matches(product, goal)
    n_options = option_matches(list(options.values()), goal.goal_options)
    denominator = len(goal.attributes) + len(goal.goal_options) + 1
    reward = (n_attrs + n_options + r_price) / denominator * type_info["r_type"]
    info = {**type_info, "r_att": n_attrs / len(goal.attributes), "w_att": len(goal.attributes) / denominator}
    if goal.goal_options:
        info["r_option"] = n_options / len(goal.goal_options)
        info["w_option"] = len(goal.goal_options) / denominator
    info["r_price"] = r_price
    info["w_price"] = 1 / denominator
    return reward, info
