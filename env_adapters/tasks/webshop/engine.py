"""The shop's pages, as upstream's text environment shows them (``WebAgentTextEnv`` in ``text`` mode).

Upstream renders HTML templates and reduces them to their visible text joined by ``" [SEP] "``; the clickables
are the page's buttons, product links (both lower-cased) and option values. This module produces the same text
and clickables directly, without HTML, from the page state, and follows upstream's ``SimServer.receive`` for every
action: ``search[keywords]`` from any page, ``click[value]`` for a value among the clickables (not ``search``);
anything else changes nothing. Pages (AgentBench's version of the templates):

- search: ``WebShop [SEP] Instruction: [SEP] <instruction> [SEP] Search``
- results: ``Instruction: [SEP] <instruction> [SEP] Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next >
  [SEP] <ASIN> [SEP] <title> [SEP] <price> ...`` (10 a page as upstream, or ``page_size``; ``< Prev`` after the
  first page)
- item: ``... [SEP] Back to Search [SEP] < Prev [SEP] <option name> [SEP] <values...> ... [SEP] <title> [SEP]
  Price: <price> [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now``
- description / features / reviews: ``... [SEP] Back to Search [SEP] < Prev [SEP] <text...>``

``Buy Now`` ends the episode with upstream's reward. Search keywords ``<r>`` (random products), ``<c> CATEGORY``,
``<q> QUERY`` and ``<a> ATTRIBUTE`` are upstream's special queries (upstream's ``<a>`` fails: it is not given the
attribute map; here it lists the products with that attribute).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from env_adapters.tasks.webshop.catalogue import Catalogue, Goal, Product
from env_adapters.tasks.webshop.reward import TitleNouns, get_reward
from env_adapters.tasks.webshop.search import SearchEngine

SEARCH_RETURN_N = 50
PRODUCT_WINDOW = 10
SEP = " [SEP] "
END_BUTTON, NEXT_PAGE, PREV_PAGE, BACK_TO_SEARCH = "Buy Now", "Next >", "< Prev", "Back to Search"
SUB_PAGES = ("Description", "Features", "Reviews")
_ACTION = re.compile(r"(.+)\[(.+)\]")
DONE_HEAD = ("Thank you for shopping with us!", "Your code:", "None", "(Paste it in your MTurk interface.)",
             "Purchased", "asin")
DONE_MIDDLE = ("attrs", "None", "category", "None", "query", "None", "product category", "None", "Target", "asin",
               "options", "attrs", "price upper", "instuction text", "category", "product category", "query", "Goal",
               "None", "Reward", "Your score (min 0.0, max 1.0)")


class Page(str, Enum):
    SEARCH = "index"
    RESULTS = "search_results"
    ITEM = "item_page"
    SUB = "item_sub_page"
    DONE = "done"


def parse_action(action: str) -> tuple[str, str | None]:
    """``search[x]`` -> ``("search", "x")``, as upstream's regex splits it; no brackets -> ``(action, None)``."""
    m = _ACTION.match(action)
    return (action, None) if m is None else (m.group(1), m.group(2))


class Shop:
    """A catalogue, its search index and the reward's title-noun tagger: built once, shared (read-only) by every
    session of a worker."""

    def __init__(self, catalogue: Catalogue, nouns: TitleNouns | None = None) -> None:
        self.catalogue, self.nouns = catalogue, nouns or TitleNouns("rule")
        self.engine = SearchEngine(catalogue.products)
        self._by_attribute: dict[str, list[Product]] | None = None

    def search(self, keywords: list[str], rng: random.Random) -> list[Product]:
        """Upstream's ``get_top_n_product_from_keywords``."""
        products = self.catalogue.products
        head = keywords[0]
        if head == "<r>":
            return rng.sample(products, k=min(SEARCH_RETURN_N, len(products)))
        if head == "<c>":
            category = keywords[1].strip() if len(keywords) > 1 else ""
            return [p for p in products if p.category == category]
        if head == "<q>":
            query = " ".join(keywords[1:]).strip()
            return [p for p in products if p.query == query]
        if head == "<a>":
            if self._by_attribute is None:
                self._by_attribute = {}
                for p in products:
                    for attribute in p.attributes:
                        self._by_attribute.setdefault(attribute, []).append(p)
            return self._by_attribute.get(" ".join(keywords[1:]).strip(), [])
        return [products[i] for i in self.engine.search(" ".join(keywords), SEARCH_RETURN_N)]


@dataclass
class Clickable:
    """What a clickable value is: a button, a product link, or a value of an option (``option`` names it)."""

    kind: str  # "button" | "product" | "option"
    option: str | None = None


@dataclass
class WebShopEnv:
    """One shopper's browser on the shared shop (upstream's ``WebAgentTextEnv`` + its ``SimServer`` session).

    Args:
        shop: The shared shop.
        goal: The goal of this episode.
        rng: Randomness of ``<r>`` searches.
        page_size: Products per results page (upstream: 10).
    """

    shop: Shop
    goal: Goal
    rng: random.Random = field(default_factory=random.Random)
    page_size: int = PRODUCT_WINDOW
    page: Page = Page.SEARCH
    keywords: list[str] | None = None
    page_number: int = 1
    asin: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    sub_page: str | None = None
    results: list[Product] = field(default_factory=list)
    reward: float = 0.0
    reward_info: dict[str, Any] = field(default_factory=dict)
    searches: int = 0

    # ---- what the agent sees ------------------------------------------------------------------

    @property
    def observation(self) -> str:
        return SEP.join(self._segments())

    def _segments(self) -> list[str]:
        instruction = self.goal.instruction_text
        if self.page is Page.SEARCH:
            return ["WebShop", "Instruction:", instruction, "Search"]
        if self.page is Page.DONE:  # the template's visible text; AgentBench ends the episode without showing it
            return [*DONE_HEAD, self.asin, "options", json.dumps(self.options, sort_keys=True), *DONE_MIDDLE,
                    str(self.reward), "Reward Details", "None"]
        segments = ["Instruction:", instruction, BACK_TO_SEARCH]
        if self.page is Page.RESULTS:
            segments.append(f"Page {self.page_number} (Total results: {len(self.results)})")
            segments += self._page_buttons()
            for p in self._page_products():
                segments += [p.asin, p.name, p.price_tag]
        elif self.page is Page.ITEM:
            product = self.product
            segments.append(PREV_PAGE)
            for name, values in product.options.items():
                segments += [name, *values]
            segments += [product.name, f"Price: {product.price_tag}", f"Rating: {product.rating}", *SUB_PAGES,
                         END_BUTTON]
        elif self.page is Page.SUB:
            segments.append(PREV_PAGE)
            segments += self._sub_page_text()
        return [s.strip() for s in segments if s.strip()]

    def _sub_page_text(self) -> list[str]:
        product = self.product
        if self.sub_page == "Description":
            return [product.description]
        if self.sub_page == "Features":
            return list(product.bullet_points)
        texts = []
        for review in product.reviews:
            texts += [f'"{review.get("title", "")}"', str(review.get("score", "")), review.get("body", "")]
        return texts

    def _page_buttons(self) -> list[str]:
        buttons = [PREV_PAGE] if self.page_number > 1 else []
        return buttons + ([NEXT_PAGE] if self.page_number * self.page_size < len(self.results) else [])

    def _page_products(self) -> list[Product]:
        start = (self.page_number - 1) * self.page_size
        return self.results[start:start + self.page_size]

    @property
    def product(self) -> Product:
        return self.shop.catalogue.by_asin[self.asin]

    def clickables(self) -> dict[str, Clickable]:
        """Upstream's ``text_to_clickable``: buttons and product links lower-cased, then option values."""
        button = Clickable("button")
        if self.page is Page.SEARCH:
            return {"search": button}
        if self.page is Page.DONE:
            return {}
        found = {BACK_TO_SEARCH.lower(): button}
        if self.page is Page.RESULTS:
            found.update((b.lower(), button) for b in self._page_buttons())
            found.update((p.asin.lower(), Clickable("product")) for p in self._page_products())
        elif self.page is Page.ITEM:
            found.update((b.lower(), button) for b in (PREV_PAGE, *SUB_PAGES, END_BUTTON))
            for name, values in self.product.options.items():
                found.update((value, Clickable("option", name)) for value in values)
        elif self.page is Page.SUB:
            found[PREV_PAGE.lower()] = button
        return found

    def available_actions(self) -> dict[str, Any]:
        """Upstream's ``get_available_actions``."""
        return {"has_search_bar": self.page is Page.SEARCH, "clickables": list(self.clickables())}

    # ---- actions -------------------------------------------------------------------------------

    def step(self, action: str) -> tuple[str, float, bool]:
        """Apply ``search[...]`` or ``click[...]``; return the observation, the reward and whether it is done."""
        name, arg = parse_action(action)
        if arg is not None:
            arg = arg.lower()
        clickables = self.clickables()
        if name == "search" and arg:
            self._search(arg.split(" "), 1)
        elif name == "click" and arg in clickables and arg != "search":
            self._click(arg, clickables[arg])
        done = self.page is Page.DONE
        return self.observation, (self.reward if done else 0.0), done

    def _search(self, keywords: list[str], page_number: int) -> None:
        self.page, self.keywords, self.page_number = Page.RESULTS, keywords, page_number
        self.asin, self.options, self.searches = None, {}, self.searches + 1
        self.results = self.shop.search(keywords, self.rng)

    def _click(self, value: str, clickable: Clickable) -> None:
        page = self.page
        if value == END_BUTTON.lower():
            self.page = Page.DONE
            self.reward, self.reward_info = get_reward(self.product, self.goal, self.shop.catalogue.prices[self.asin],
                                                       self.options, self.shop.nouns)
        elif value == BACK_TO_SEARCH.lower():
            self.page, self.keywords, self.page_number, self.asin, self.options = Page.SEARCH, None, 1, None, {}
        elif value == NEXT_PAGE.lower() and page is Page.RESULTS:
            self._search(self.keywords, self.page_number + 1)
        elif value == PREV_PAGE.lower() and page is Page.RESULTS:
            self._search(self.keywords, self.page_number - 1)
        elif value == PREV_PAGE.lower() and page is Page.SUB:
            self.page = Page.ITEM
        elif value == PREV_PAGE.lower() and page is Page.ITEM:
            self._search(self.keywords, self.page_number)
        elif value in (s.lower() for s in SUB_PAGES):
            self.page, self.sub_page = Page.SUB, next(s for s in SUB_PAGES if s.lower() == value)
        elif clickable.kind == "product":
            self.page, self.asin = Page.ITEM, value.upper()
        elif clickable.kind == "option":
            self.page, self.options[clickable.option] = Page.ITEM, value
