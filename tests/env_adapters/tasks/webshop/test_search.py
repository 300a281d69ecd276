"""WebShop search ranks as upstream's pyserini does: recorded results (``bench/webshop_upstream.py record``)
and the analyzer's and length encoding's rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from env_adapters.tasks.webshop.catalogue import Catalogue
from env_adapters.tasks.webshop.generator import GeneratorConfig, generate_catalogue
from env_adapters.tasks.webshop.search import SearchEngine, byte4_to_int, int_to_byte4, stem_word, text_terms

DATA = Path(__file__).parent / "data"
RECORDING = json.loads((DATA / "pyserini.json").read_text())["catalogues"]


def _catalogue(name: str) -> Catalogue:
    if name == "generated":  # the recording's: the standard preset, seed 0
        return generate_catalogue(GeneratorConfig(), seed=0)
    return Catalogue.from_raw(json.loads((DATA / "handwritten_items.json").read_text()), {}, {})


@pytest.mark.parametrize("name", ["generated", "handwritten"])
def test_every_recorded_query_gets_upstreams_top_50_in_upstreams_order(name):
    catalogue, rows = _catalogue(name), RECORDING[name]
    engine = SearchEngine(catalogue.products)
    assert len(rows) >= 200
    ours = {query: [catalogue.products[i].asin for i in engine.search(query, 50)] for query, _ in rows}
    assert [(query, ours[query], hits) for query, hits in rows if ours[query] != hits] == []
    # The recording exercises the order, not only the first hit: most queries have several hits.
    assert sum(len(hits) >= 2 for _, hits in rows) > len(rows) // 2


def test_the_analyzer_keeps_what_lucenes_english_analyzer_keeps():
    # Each case as Anserini's DefaultEnglishAnalyzer (Lucene 8) analyses it.
    cases = {
        "women’s x-large 1.5 qt 10,000mah a,b e.g. usb-c": ["women", "x", "larg", "1.5", "qt", "10,000mah", "b", "e.g",
                                                          "usb", "c"],
        "color:red 1;2 x,y 3.a": ["color:r", "1;2", "x", "y", "3"],
        "rock'n'roll the 80's tour": ["rock'n'rol", "80", "s", "tour"],
        "xs s technology responsibly assembly": ["xs", "s", "technolog", "respons", "assembl"],
        "tempshield™ 500°f": ["tempshield", "™", "500", "f"],
    }
    for text, lucene in cases.items():
        assert [stem_word(w) for w in text_terms(text)] == lucene, text


def test_lengths_are_stored_in_one_byte_as_lucene_stores_them():
    codes = [int_to_byte4(n) for n in range(100_000)]
    assert codes[:24] == list(range(24))  # exact below 24
    assert codes == sorted(codes) and max(codes) < 256
    for n, code in enumerate(codes):  # each byte stands for the largest length it covers from below
        assert byte4_to_int(code) <= n < (byte4_to_int(code + 1) if code < 255 else 2**31)
    assert byte4_to_int(int_to_byte4(40)) == 40 and byte4_to_int(int_to_byte4(41)) == 40  # lossy above
