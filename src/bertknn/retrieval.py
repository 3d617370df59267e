"""Retrieval stage: DrQA-style TF-IDF document ranking and the title shortcut (SPEC §2).

Features are unigrams and bigrams of lowercased tokens, an n-gram dropped when any of its tokens is a stopword or
punctuation, hashed with unsigned murmur3 (scikit-learn's) modulo 2^24. A document's weight for a feature is
log1p(count) * idf, idf = max(0, log((N - Nt + .5) / (Nt + .5))); a query is weighted the same way and scored by
the sparse dot product. The index stores log1p(count) per (feature, document) in compressed sparse columns over the
features that occur, as .npy files opened with mmap; idf is computed from the column lengths at query time, so
appending documents (a new segment) needs no re-weighting. Documents that are being added or were removed are never
returned.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import sparse
from sklearn.utils import murmurhash3_32

from bertknn.datastore import Datastore, DatastoreError
from bertknn.text import MASK, STOPWORDS, normalize_title

NUM_BUCKETS = 2**24
TOKEN_RE = re.compile(r"\w+|[^\w\s]")  # DrQA's simple tokenizer: runs of word characters, or one other character
FILES = ("tfidf_hashes.npy", "tfidf_indptr.npy", "tfidf_docs.npy", "tfidf_logtf.npy")
SEGMENT_PREFIX = "tfidf_add_"


def tokenize(text: str) -> list[str]:
    """Lowercased, NFKC-normalised word and punctuation tokens."""
    return TOKEN_RE.findall(unicodedata.normalize("NFKC", text).lower())


def _keep(token: str) -> bool:
    return token not in STOPWORDS and any(ch.isalnum() for ch in token)


def ngram_hashes(text: str) -> list[int]:
    """Hashed unigram and bigram features of `text` (with repeats), stopword and punctuation n-grams dropped."""
    tokens = tokenize(text)
    keep = [_keep(t) for t in tokens]
    grams = [t for t, k in zip(tokens, keep) if k]
    grams += [f"{a} {b}" for a, b, ka, kb in zip(tokens, tokens[1:], keep, keep[1:]) if ka and kb]
    return [murmurhash3_32(g, positive=True) % NUM_BUCKETS for g in grams]


def question_query(question: str) -> str:
    """IR query text of a free cloze question: the question without its mask and sentence punctuation."""
    return re.sub(r"[^\w\s]", " ", question.replace(MASK, " ")).strip()


@dataclass(frozen=True)
class Segment:
    """log1p(count) per (feature, document) for a run of documents, column-wise: feature -> documents."""

    hashes: np.ndarray  # uint32, sorted: the features that occur
    indptr: np.ndarray  # int64, column c holds docs[indptr[c]:indptr[c + 1]]
    docs: np.ndarray  # int32 document indices (absolute)
    logtf: np.ndarray  # float32

    def lookup(self, qh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(column of each query feature, whether the segment has it)."""
        if not len(self.hashes):
            return np.zeros(len(qh), np.int64), np.zeros(len(qh), bool)
        cols = np.minimum(np.searchsorted(self.hashes, qh), len(self.hashes) - 1)
        return cols, self.hashes[cols] == qh


def _load_segment(part: Path) -> Segment:
    """A segment's arrays, memory-mapped and checked for the shapes that make them one index."""
    arrays = []
    for name in FILES:
        try:
            arrays.append(np.load(part / name, mmap_mode="r"))
        except (ValueError, OSError, EOFError) as err:
            raise DatastoreError(f"{part / name} is damaged ({err}); `bertknn verify` checks the store") from None
    segment = Segment(*arrays)
    ok = (
        segment.hashes.ndim == segment.indptr.ndim == segment.docs.ndim == segment.logtf.ndim == 1
        and len(segment.indptr) == len(segment.hashes) + 1
        and len(segment.docs) == len(segment.logtf)
        and (len(segment.indptr) == 0 or segment.indptr[-1] == len(segment.docs))
    )
    if not ok:
        raise DatastoreError(f"the IR index in {part} is damaged (its arrays do not fit together)")
    return segment


class TfidfIndex:
    """Hashed TF-IDF over documents 0..N-1: a base segment plus one segment per batch of added documents.

    Added documents get their own segment (written once, never rewritten); idf sums the document frequencies of all
    segments, so an index built in parts scores exactly like one built at once.
    """

    def __init__(self, segments: list[Segment], n_docs: int) -> None:
        self.segments, self.n_docs = segments, n_docs

    @classmethod
    def build(cls, texts: Iterable[str], first: int = 0) -> TfidfIndex:
        """Index documents given in order: the i-th text is document `first + i`."""
        rows, cols, counts = [], [], []  # one small array per document: ~16 bytes per (document, feature)
        n = 0
        for i, text in enumerate(texts):
            counted = Counter(ngram_hashes(text))
            rows.append(np.full(len(counted), i, dtype=np.int32))
            cols.append(np.fromiter(counted.keys(), np.int64, len(counted)))
            counts.append(np.fromiter(counted.values(), np.float32, len(counted)))
            n = i + 1
        if not n:
            return cls([], first)
        hashes, col = np.unique(np.concatenate(cols), return_inverse=True)
        mat = sparse.csc_matrix((np.log1p(np.concatenate(counts)), (np.concatenate(rows), col)), shape=(n, len(hashes)))
        mat.sort_indices()
        segment = Segment(
            hashes.astype(np.uint32), mat.indptr.astype(np.int64), (mat.indices + first).astype(np.int32), mat.data
        )
        return cls([segment], first + n)

    @staticmethod
    def files(first: int) -> list[str]:
        """The files (relative to the datastore) that `save(..., first)` writes."""
        names = [*FILES, "tfidf_ndocs.txt"]
        return names if first == 0 else [f"{SEGMENT_PREFIX}{first:09d}/{name}" for name in names]

    def save(self, directory: str | Path, first: int = 0) -> None:
        """Write a one-segment index: documents from 0 as the base files, else as a segment folder (renamed whole)."""
        (segment,) = self.segments
        directory = Path(directory)
        target = directory if first == 0 else directory / f"{SEGMENT_PREFIX}{first:09d}"
        out = target if first == 0 else target.with_name(target.name + ".tmp")
        out.mkdir(exist_ok=True)
        for name, array in zip(FILES, (segment.hashes, segment.indptr, segment.docs, segment.logtf)):
            tmp = out / f"{name}.tmp"
            with tmp.open("wb") as handle:
                np.save(handle, array)
            tmp.replace(out / name)
        (out / "tfidf_ndocs.txt").write_text(str(self.n_docs))
        if out != target:
            out.replace(target)

    @classmethod
    def load(cls, directory: str | Path) -> TfidfIndex:
        """Open a saved index (base files and any added segments) with memory-mapped arrays."""
        directory = Path(directory)
        parts = [directory, *sorted(p for p in directory.glob(f"{SEGMENT_PREFIX}*") if not p.name.endswith(".tmp"))]
        segments, n_docs = [], 0
        for part in parts:
            missing = [n for n in (*FILES, "tfidf_ndocs.txt") if not (part / n).is_file()]
            if missing:
                raise FileNotFoundError(f"{part} has no IR index ({', '.join(missing)} missing): rerun `bertknn build`")
            segments.append(_load_segment(part))
            try:
                n_docs = max(n_docs, int((part / "tfidf_ndocs.txt").read_text(encoding="utf-8")))
            except (ValueError, UnicodeDecodeError):
                raise DatastoreError(
                    f"{part / 'tfidf_ndocs.txt'} is damaged; `bertknn verify` checks the store"
                ) from None
        return cls(segments, n_docs)

    def idf(self, nt: np.ndarray) -> np.ndarray:
        """idf from document frequencies: max(0, log((N - Nt + .5) / (Nt + .5)))."""
        nt = np.asarray(nt, np.float64)
        return np.maximum(0.0, np.log((self.n_docs - nt + 0.5) / (nt + 0.5)))

    def scores(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """(documents, scores) of every document sharing a weighted feature with `query`, unsorted."""
        counted = Counter(ngram_hashes(query))
        if not counted:
            return np.zeros(0, np.int64), np.zeros(0)
        qh = np.fromiter(counted.keys(), np.int64)
        found = [(seg, *seg.lookup(qh)) for seg in self.segments]
        nt = np.zeros(len(qh), np.int64)
        for seg, cols, has in found:  # a segment may hold no feature at all (documents of stopwords only)
            nt[has] += seg.indptr[cols[has] + 1] - seg.indptr[cols[has]]
        weight = np.log1p(np.fromiter(counted.values(), np.float64)) * self.idf(nt) ** 2  # query weight x doc idf
        docs, vals = [], []
        for seg, cols, has in found:
            for c, w in zip(cols[has], weight[has]):
                lo, hi = seg.indptr[c], seg.indptr[c + 1]
                docs.append(seg.docs[lo:hi])
                vals.append(seg.logtf[lo:hi] * w)
        if not docs:
            return np.zeros(0, np.int64), np.zeros(0)
        unique, inverse = np.unique(np.concatenate(docs), return_inverse=True)
        return unique.astype(np.int64), np.bincount(inverse, weights=np.concatenate(vals))

    def top(self, query: str, n: int, hidden: np.ndarray | None = None) -> list[int]:
        """The `n` best-scoring documents (score > 0, not `hidden`), best first, ties broken by document order."""
        docs, scores = self.scores(query)
        keep = scores > 0
        if hidden is not None and len(hidden):
            keep &= ~np.isin(docs, hidden)
        docs, scores = docs[keep], scores[keep]
        order = np.lexsort((docs, -scores))[:n]
        return docs[order].tolist()


def select_documents(store: Datastore, index: TfidfIndex, question: str, subject: str | None, n_docs: int) -> list[int]:
    """Documents for a question: the one titled `subject` when there is one, else the top `n_docs` by TF-IDF.

    The query is the subject for knowledge-base questions, else the question without mask and punctuation.
    """
    if subject:
        titled = store.find_title(normalize_title(subject))
        if titled is not None:
            return [titled]
    return index.top(subject or question_query(question), n_docs, store.hidden_documents())
