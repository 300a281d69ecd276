"""BM25 search over a catalogue, built once per worker and shared by every session: upstream's ranking, to the bit.

Upstream indexes one document per product with pyserini 0.17 (Anserini 0.14.3 on Lucene 8): the lower-cased title,
description, first feature and option text (``search_engine/convert_product_file_format.py``), analysed by Anserini's
English analyzer, and returns the top 50 of ``LuceneSearcher.search(keywords, k=50)``. This engine computes the same
ranking, which is why it is written here instead of using a BM25 library (none stores lengths as Lucene does):

- analysis: Lucene's StandardTokenizer (Unicode word boundaries: letters joined across ``.``, ``'`` and ``:``,
  digits across ``.``, ``,`` and ``;``), the English possessive filter (a trailing ``'s`` dropped), Lucene's English
  stop words, Lucene's Porter stemmer (Martin Porter's reference version, whose departures from the 1980 paper
  NLTK implements as ``MARTIN_EXTENSIONS``: words of one or two letters kept, ``-logi`` and ``-bli`` rules); emoji
  and signs such as ``™`` are tokens of their own, as Lucene's tokenizer makes them;
- a query is a bag of its terms, each weighted by how often it occurs (Anserini's ``BagOfWordsQueryGenerator``);
- scores as Lucene 8's ``BM25Similarity(k1=0.9, b=0.4)`` computes them, in 32-bit floats and in its order of
  operations, with each document's length stored in one byte (``SmallFloat.intToByte4``: exact below 24 terms,
  four significant bits above); a document's score is the sum of its terms' scores in double precision, then
  rounded to a float;
- ranking by score, ties by document id (the ASIN) ascending (Anserini's ``BREAK_SCORE_TIES_BY_DOCID``); only
  documents that contain a query term are returned.

``bench/webshop_upstream.py`` compares the results with pyserini's on recorded queries; what still differs is
in ``docs/environments/webshop.md``.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
from nltk.stem.porter import PorterStemmer

from env_adapters.tasks.webshop.catalogue import Product

K1, B = np.float32(0.9), np.float32(0.4)  # pyserini's BM25 defaults
# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET, the stop words of Anserini's default analyzer.
STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these they "
    "this to was will with".split())
_LETTER, _DIGIT = r"[^\W\d_]", r"\d"
# Word-boundary rules of Unicode's UAX #29 as far as product text needs them: MidLetter, MidNumLet and the apostrophe
# join letters; MidNum, MidNumLet and the apostrophe join digits; letters, digits and underscores run together.
_EMOJI = "©®‼⁉™ℹ↔-↙↩↪⌚⌛⌨⏏⏩-⏳⏸-⏺Ⓜ▪▫▶◀◻-◾☀-➿⤴⤵⬅-⬇⬛⬜⭐⭕〰〽㊗㊙\U0001F000-\U0001FAFF"
_WORD = re.compile(
    rf"\w+(?:(?:(?<={_LETTER})[:·.‘’'＇．](?={_LETTER})|(?<={_DIGIT})[,;.‘’'＇．⁄](?={_DIGIT}))\w+)*|[{_EMOJI}]")
_POSSESSIVE = ("'s", "’s", "＇s")  # EnglishPossessiveFilter (after lower-casing, as the text already is)


_PORTER = PorterStemmer(mode=PorterStemmer.MARTIN_EXTENSIONS)


def text_terms(text: str) -> list[str]:
    """The words Lucene's analyzer keeps of ``text``, before stemming."""
    words = (w[:-2] if w.endswith(_POSSESSIVE) else w for w in _WORD.findall(text.lower()))
    return [w for w in words if w not in STOP_WORDS]


def stem_word(word: str) -> str:
    return _PORTER.stem(word, to_lowercase=False)


def document_text(product: Product) -> str:
    """What upstream indexes for a product: title, description, first feature and options, lower-cased."""
    option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in product.options.items())
    first_feature = product.bullet_points[0] if product.bullet_points else ""
    return " ".join([product.name, product.description, first_feature, option_text]).lower()


def int_to_byte4(value: int) -> int:
    """Lucene's ``SmallFloat.intToByte4``: a length in one byte, exact below 24, else four significant bits."""
    if value < _FREE:
        return value
    value -= _FREE
    shift = value.bit_length() - 4
    return _FREE + (value if shift < 0 else ((value >> shift) & 0x07) | ((shift + 1) << 3))


def byte4_to_int(code: int) -> int:
    """Lucene's ``SmallFloat.byte4ToInt``: the length a byte stands for."""
    if code < _FREE:
        return code
    bits, shift = (code - _FREE) & 0x07, ((code - _FREE) >> 3) - 1
    return _FREE + (bits if shift < 0 else (bits | 0x08) << shift)


_FREE = 24  # 255 - longToInt4(Integer.MAX_VALUE): the byte values that stand for themselves
LENGTH_TABLE = np.array([byte4_to_int(code) for code in range(256)], dtype=np.float32)


class SearchEngine:
    """BM25 over the catalogue's products (positions in ``products`` are the document ids).

    Args:
        products: The catalogue's products, in catalogue order.
    """

    def __init__(self, products: list[Product]) -> None:
        self.vocab: dict[str, int] = {}  # stem -> term id
        stems: dict[str, int] = {}  # word -> term id, while indexing
        terms, lengths = [], np.zeros(len(products), dtype=np.int64)
        for doc, product in enumerate(products):
            ids = []
            for word in text_terms(document_text(product)):
                if word not in stems:
                    stems[word] = self.vocab.setdefault(stem_word(word), len(self.vocab))
                ids.append(stems[word])
            terms.append(np.array(ids, dtype=np.int64))
            lengths[doc] = len(ids)
        n_docs = max(len(products), 1)
        docs = np.repeat(np.arange(len(products), dtype=np.int64), lengths)
        keys, freqs = np.unique(np.concatenate(terms) * n_docs + docs if terms else docs, return_counts=True)
        # Postings sorted by term, then document: term t's are postings[offsets[t]:offsets[t + 1]].
        self.post_docs, self.post_freqs = keys % n_docs, freqs.astype(np.float32)
        self.offsets = np.searchsorted(keys // n_docs, np.arange(len(self.vocab) + 1))
        doc_freqs = np.diff(self.offsets)
        self.idf = np.array([math.log(1 + (len(products) - df + 0.5) / (df + 0.5)) for df in doc_freqs],
                            dtype=np.float64).astype(np.float32)
        avgdl = np.float32(lengths.sum() / n_docs) or np.float32(1)  # an empty catalogue scores nothing
        cache = np.float32(1) / (K1 * ((np.float32(1) - B) + B * LENGTH_TABLE / avgdl))
        self.norm_inverse = cache[[int_to_byte4(int(n)) for n in lengths]].astype(np.float32)
        # Ties go by the ASIN's bytes (Lucene compares the id field's UTF-8).
        order = sorted(range(len(products)), key=lambda i: products[i].asin.encode())
        self.id_rank = np.empty(len(products), dtype=np.int64)
        self.id_rank[order] = np.arange(len(products))

    def search(self, query: str, k: int) -> list[int]:
        """Document ids of the ``k`` best matches of ``query`` (fewer when fewer documents match)."""
        # Stemmed afresh: a cache would grow with every new word of every query.
        boosts = Counter(t for t in (self.vocab.get(stem_word(w)) for w in text_terms(query)) if t is not None)
        if not boosts:
            return []
        total = np.zeros(len(self.id_rank), dtype=np.float64)
        matched = np.zeros(len(self.id_rank), dtype=bool)
        for term, count in boosts.items():
            lo, hi = self.offsets[term], self.offsets[term + 1]
            docs = self.post_docs[lo:hi]
            weight = np.float32(count) * self.idf[term]
            # BM25Scorer.score: weight - weight / (1 + freq * normInverse), in floats
            total[docs] += weight - weight / (np.float32(1) + self.post_freqs[lo:hi] * self.norm_inverse[docs])
            matched[docs] = True
        hits = np.flatnonzero(matched)
        scores = total[hits].astype(np.float32)
        if len(hits) > k:
            # the k-th best score, then everything at least as good (ties beyond k resolved by id below)
            kth = np.partition(scores, len(hits) - k)[len(hits) - k]
            keep = scores >= kth
            hits, scores = hits[keep], scores[keep]
        order = np.lexsort((self.id_rank[hits], -scores))  # score descending, then document id
        return hits[order][:k].tolist()
