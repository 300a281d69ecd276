"""WebShop against upstream's own libraries: the search against pyserini 0.17.0 (Anserini 0.14.3, Lucene 8) as
upstream WebShop indexes and queries it (``search_engine/run_indexing.sh``, ``LuceneSearcher.search(keywords, k=50)``),
and the reward's fuzzy matching against thefuzz 0.19.0, which AgentBench's WebShop pins (its ``token_set_ratio`` is
difflib's; 0.22, installed here, uses rapidfuzz and scores some pairs differently).

Two catalogues: the generated ``standard`` preset (10,000 products, seed 0) and a hand-written one of 40 products with
the tokenizer's hard cases (possessives, hyphens, decimals, units, curly quotes, accents). Their queries: goal
instructions with and without the price clause, titles, and words drawn from the documents (repeats included, which
upstream weighs as query-term boosts).

- ``record-search``: indexes both catalogues with upstream's command and records pyserini's top 50 for every query
  in ``tests/env_adapters/tasks/webshop/data/pyserini.json``. Needs Java 11+ and an interpreter with
  ``pip install --no-deps pyserini==0.17.0 pyjnius`` (the wheel carries Anserini's jar; the rest of pyserini's
  dependencies are not needed for this).
- ``record-fuzz``: records thefuzz 0.19.0's ``token_set_ratio > 85`` decision (the reward's attribute and option
  match) for every pair of two attributes or two option values of the catalogues, one bit a pair, in
  ``tests/env_adapters/tasks/webshop/data/thefuzz019.json``. Needs a folder where thefuzz 0.19.0 imports
  (``pip install --no-deps --target DIR thefuzz==0.19.0``; without python-Levenshtein, as upstream runs it).
- without a command: compares this project's search and fuzzy matching with the recordings and prints, per
  catalogue, how many first pages (10 results) and top-50 lists are equal, and how many match decisions agree.

Usage::

    python -m bench.webshop_upstream record-search --pyserini-python /path/to/venv/bin/python
    python -m bench.webshop_upstream record-fuzz --thefuzz-path DIR
    python -m bench.webshop_upstream

How to read the figures: ``docs/environments/webshop.md``.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import tempfile
from pathlib import Path

from thefuzz import fuzz

from env_adapters.tasks.webshop.catalogue import Catalogue
from env_adapters.tasks.webshop.generator import GeneratorConfig, generate_catalogue
from env_adapters.tasks.webshop.reward import MATCH_THRESHOLD
from env_adapters.tasks.webshop.search import SearchEngine, document_text

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "env_adapters" / "tasks" / "webshop" / "data"
HANDWRITTEN = DATA / "handwritten_items.json"
RECORDING = DATA / "pyserini.json"
FUZZ_RECORDING = DATA / "thefuzz019.json"
TOP_K = 50  # upstream's SEARCH_RETURN_N
PAGE = 10  # results on one page

# Queries that exercise the analyzer on the hand-written catalogue, beside those drawn from it.
HAND_QUERIES = [
    "men's t-shirt", "mens", "women’s leggings", "usb-c cable 100w", "usb c", "1.5 qt saucepan", "1.5", "l'oréal serum",
    "rock'n'roll tee", "80's", "3/4\" pex", "10,000mah power bank", "10000mah", "it's a vibe", "the", "a an the",
    "wi-fi 5", "café con leche", "dr. bronner's soap", "e-marker", "5a/20v", "iphone 12 pocket", "k-cup pods 72 count",
    "x-large", "xx-large grey", "navy/white", "4k monitor 27\"", "ps5 controller red", "baby yoda", "1,023 pieces",
    "oz.", "fl. oz.", "33.8 fl oz", "s/m cardigan", "30w x 30l", "45mm watch", "gps", "alexa", "echo dot 4th gen",
    "chef's knife 8\"", "dog's toy", "cats", "cat's meow", "500°f oven", "105°f–400°f", "tempshield™", "hey siri",
    "aa batteries 48-pack", "pack", "2-pack", "spain's olive oil", "oct.–dec.", "100% cotton", "100", "x", "ipx8",
    "shirt shirt shirt", "coffee coffee dark roast", "wireless wireless earbuds", "smart smart smart speaker",
]


def _load_handwritten() -> Catalogue:
    return Catalogue.from_raw(json.loads(HANDWRITTEN.read_text()), {}, {})


def catalogues() -> dict[str, tuple[Catalogue, list[str]]]:
    """The two catalogues and their queries, the same on every call."""
    generated = generate_catalogue(GeneratorConfig(), seed=0)
    rng = random.Random("webshop-upstream-search")
    queries = []
    for goal in rng.sample(generated.goals, 100):
        queries.append(goal.instruction_text)
        queries.append(re.sub(r",? and price lower than [\d.]+ dollars$", "", goal.instruction_text))
    queries += [p.name.lower() for p in rng.sample(generated.products, 100)]
    queries += [_words(p, rng) for p in rng.sample(generated.products, 100)]
    hand = _load_handwritten()
    hand_queries = [*HAND_QUERIES]
    for product in hand.products:
        hand_queries += [product.name.lower(), product.query, _words(product, rng), _words(product, rng)]
    return {"generated": (generated, queries), "handwritten": (hand, hand_queries)}


def _words(product, rng: random.Random) -> str:
    """One to five words of a product's document (a repeat now and then)."""
    words = document_text(product).split()
    picked = rng.sample(words, min(len(words), rng.randint(1, 5)))
    if rng.random() < 0.2:
        picked.append(picked[0])
    return " ".join(picked)


# Runs under the pyserini interpreter: upstream's indexing command, then LuceneSearcher.search(q, k) as pyserini
# 0.17's LuceneSearcher calls it (Anserini's SimpleSearcher.search(String, int)).
_PYSERINI = r"""
import json, sys
from pyserini.pyclass import autoclass
work, k = sys.argv[1], int(sys.argv[2])
spec = json.load(open(f"{work}/spec.json"))
out = {}
for name, queries in spec.items():
    autoclass("io.anserini.index.IndexCollection").main([
        "-collection", "JsonCollection", "-input", f"{work}/{name}", "-index", f"{work}/{name}.index",
        "-generator", "DefaultLuceneDocumentGenerator", "-threads", "1",
        "-storePositions", "-storeDocvectors", "-storeRaw"])
    searcher = autoclass("io.anserini.search.SimpleSearcher")(f"{work}/{name}.index")
    out[name] = [[hit.docid for hit in searcher.search(q, k)] for q in queries]
json.dump(out, open(f"{work}/hits.json", "w"))
"""


def record_search(pyserini_python: str) -> None:
    """Index both catalogues with pyserini as upstream does and write its hits for every query to the recording."""
    cats = catalogues()
    with tempfile.TemporaryDirectory() as work:
        for name, (catalogue, _) in cats.items():
            (Path(work) / name).mkdir()
            with open(Path(work) / name / "documents.jsonl", "w") as f:
                for product in catalogue.products:
                    f.write(json.dumps({"id": product.asin, "contents": document_text(product)}) + "\n")
        (Path(work) / "spec.json").write_text(json.dumps({name: queries for name, (_, queries) in cats.items()}))
        subprocess.run([pyserini_python, "-c", _PYSERINI, work, str(TOP_K)], check=True)
        hits = json.loads((Path(work) / "hits.json").read_text())
    # One line per query: [query, [ASIN of each hit, best first]].
    engine = f"pyserini 0.17.0 (Anserini 0.14.3), LuceneSearcher.search(query, k={TOP_K})"
    lines = [f'{{"engine": {json.dumps(engine)}, "catalogues": {{']
    for c, (name, (_, queries)) in enumerate(cats.items()):
        lines.append(f"{json.dumps(name)}: [")
        rows = [json.dumps([q, h], ensure_ascii=False) for q, h in zip(queries, hits[name], strict=True)]
        lines.append(",\n".join(rows))
        lines.append("]" + ("," if c < len(cats) - 1 else ""))
    RECORDING.write_text("\n".join(lines) + "\n}}\n")
    print(f"[webshop_upstream] wrote {RECORDING.relative_to(ROOT)}: "
          + ", ".join(f"{name} {len(queries)} queries" for name, (_, queries) in cats.items()))


def fuzz_kinds() -> list[list[str]]:
    """The strings whose pairs' ``token_set_ratio > 85`` decisions are recorded, by kind (the reward compares within
    a kind): the generated catalogue's attributes and option values, and the hand-written catalogue's option values."""
    generated, hand = generate_catalogue(GeneratorConfig(), seed=0), _load_handwritten()
    return [sorted({a for p in generated.products for a in p.attributes}),
            sorted({v for p in generated.products for values in p.options.values() for v in values}),
            sorted({v for p in hand.products for values in p.options.values() for v in values})]


def fuzz_pairs(kinds: list[list[str]]) -> list[tuple[str, str]]:
    """Every ordered pair of two different strings of one kind."""
    return [(a, b) for kind in kinds for a in kind for b in kind if a != b]


_THEFUZZ = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import thefuzz
from thefuzz import fuzz
assert thefuzz.__version__ == "0.19.0", thefuzz.__version__
print(json.dumps([fuzz.token_set_ratio(a, b) for a, b in json.load(sys.stdin)]))
"""


def record_fuzz(thefuzz_path: str) -> None:
    """thefuzz 0.19.0's decision on every pair of :func:`fuzz_kinds`, as one bit a pair (``fuzz_pairs``' order)."""
    import sys

    kinds = fuzz_kinds()
    pairs = fuzz_pairs(kinds)
    done = subprocess.run([sys.executable, "-I", "-c", _THEFUZZ, thefuzz_path], input=json.dumps(pairs),
                          capture_output=True, text=True, check=True)
    scores = json.loads(done.stdout)
    bits = "".join("1" if score > MATCH_THRESHOLD else "0" for score in scores)
    FUZZ_RECORDING.write_text(json.dumps({
        "library": "thefuzz 0.19.0 (difflib), fuzz.token_set_ratio(a, b) > 85", "kinds": kinds,
        "decisions": f"{int('1' + bits, 2):x}"}, separators=(",", ":"), ensure_ascii=False) + "\n")
    print(f"[webshop_upstream] wrote {FUZZ_RECORDING.relative_to(ROOT)}: {len(pairs)} pairs, "
          f"{bits.count('1')} matches, {sum(70 <= s <= 95 for s in scores)} with a score of 70-95")


def recorded_fuzz_decisions() -> tuple[list[tuple[str, str]], list[bool]]:
    """The recorded pairs and thefuzz 0.19.0's decision for each."""
    recorded = json.loads(FUZZ_RECORDING.read_text())
    bits = bin(int(recorded["decisions"], 16))[3:]  # past "0b1"
    return fuzz_pairs(recorded["kinds"]), [bit == "1" for bit in bits]


def compare() -> dict[str, dict[str, int]]:
    """This engine against the recording: per catalogue, queries whose first page / top 50 are equal."""
    recording = json.loads(RECORDING.read_text())["catalogues"]
    figures = {}
    for name, (catalogue, queries) in catalogues().items():
        engine, rows = SearchEngine(catalogue.products), recording[name]
        assert [q for q, _ in rows] == queries, f"{name}: the queries changed since the recording; record again"
        page = top = 0
        for query, theirs in rows:
            ours = [catalogue.products[i].asin for i in engine.search(query, TOP_K)]
            page += ours[:PAGE] == theirs[:PAGE]
            top += ours == theirs
            if ours != theirs:
                print(f"  {name}: {query!r}: ours {ours[:PAGE]}, upstream {theirs[:PAGE]}")
        figures[name] = {"queries": len(rows), "first_page_equal": page, "top50_equal": top}
        print(f"[webshop_upstream] {name}: first page equal {page}/{len(rows)}, top 50 equal {top}/{len(rows)}")
    pairs, decisions = recorded_fuzz_decisions()
    agree = sum((fuzz.token_set_ratio(a, b) > MATCH_THRESHOLD) == d for (a, b), d in zip(pairs, decisions, strict=True))
    figures["fuzz"] = {"pairs": len(pairs), "decisions_equal": agree}
    print(f"[webshop_upstream] fuzzy match (> {MATCH_THRESHOLD}): {agree}/{len(pairs)} decisions as thefuzz 0.19's")
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=["record-search", "record-fuzz"],
                        help="record upstream's results (else compare with the recordings)")
    parser.add_argument("--pyserini-python", help="interpreter with pyserini 0.17.0 and pyjnius (record-search)")
    parser.add_argument("--thefuzz-path", help="folder where thefuzz 0.19.0 imports (record-fuzz)")
    args = parser.parse_args(argv)
    if args.command == "record-search":
        if not args.pyserini_python:
            parser.error("record-search needs --pyserini-python (an interpreter with pyserini 0.17.0 and pyjnius)")
        record_search(args.pyserini_python)
    elif args.command == "record-fuzz":
        if not args.thefuzz_path:
            parser.error("record-fuzz needs --thefuzz-path (pip install --no-deps --target DIR thefuzz==0.19.0)")
        record_fuzz(args.thefuzz_path)
    else:
        compare()


if __name__ == "__main__":
    main()
