"""Retrieval stage: DrQA-style TF-IDF document ranking and the title shortcut (SPEC §2).

Features are unigrams and bigrams of lowercased tokens, an n-gram dropped when any of its tokens is a stopword or
punctuation, hashed with unsigned murmur3 (scikit-learn's) modulo 2^24. A document's weight for a feature is
log1p(count) * idf, idf = max(0, log((N - Nt + .5) / (Nt + .5))); a query is weighted the same way and scored by
the sparse dot product. The index stores log1p(count) per (feature, document) in compressed sparse columns over the
features that occur, as .npy files opened with mmap; idf is computed from the column lengths at query time, so
appending documents needs no re-weighting.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from scipy import sparse
from sklearn.utils import murmurhash3_32

from bertknn.datastore import Datastore
from bertknn.text import MASK, STOPWORDS

NUM_BUCKETS = 2**24
TOKEN_RE = re.compile(r"\w+|[^\w\s]")  # DrQA's simple tokenizer: runs of word characters, or one other character
FILES = ("tfidf_hashes.npy", "tfidf_indptr.npy", "tfidf_docs.npy", "tfidf_logtf.npy")


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


class TfidfIndex:
    """Hashed TF-IDF over documents 0..N-1, stored column-wise (feature -> documents)."""

    def __init__(self, hashes: np.ndarray, indptr: np.ndarray, docs: np.ndarray, logtf: np.ndarray, n_docs: int):
        self.hashes, self.indptr, self.docs, self.logtf, self.n_docs = hashes, indptr, docs, logtf, n_docs

    @classmethod
    def build(cls, texts: Iterable[str]) -> TfidfIndex:
        """Index documents given in order (document i is the i-th text)."""
        rows, cols, counts = [], [], []
        n_docs = 0
        for i, text in enumerate(texts):
            counted = Counter(ngram_hashes(text))
            rows.extend([i] * len(counted))
            cols.extend(counted.keys())
            counts.extend(counted.values())
            n_docs = i + 1
        hashes, col = np.unique(np.asarray(cols, dtype=np.int64), return_inverse=True)
        mat = sparse.csc_matrix(
            (np.log1p(np.asarray(counts, dtype=np.float32)), (np.asarray(rows, dtype=np.int64), col)),
            shape=(n_docs, len(hashes)),
        )
        mat.sort_indices()
        return cls(
            hashes.astype(np.uint32),
            mat.indptr.astype(np.int64),
            mat.indices.astype(np.int32),
            mat.data.astype(np.float32),
            n_docs,
        )

    def save(self, directory: str | Path) -> None:
        """Write the index as .npy files (each written to a temporary name, then renamed)."""
        directory = Path(directory)
        for name, array in zip(FILES, (self.hashes, self.indptr, self.docs, self.logtf)):
            tmp = directory / f"{name}.tmp"
            with tmp.open("wb") as handle:
                np.save(handle, array)
            tmp.replace(directory / name)
        (directory / "tfidf_ndocs.txt").write_text(str(self.n_docs))

    @classmethod
    def load(cls, directory: str | Path) -> TfidfIndex:
        """Open a saved index with memory-mapped arrays."""
        directory = Path(directory)
        missing = [n for n in (*FILES, "tfidf_ndocs.txt") if not (directory / n).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{directory} has no IR index ({', '.join(missing)} missing): rerun `bertknn build`"
            )
        arrays = [np.load(directory / n, mmap_mode="r") for n in FILES]
        return cls(*arrays, int((directory / "tfidf_ndocs.txt").read_text()))

    def idf(self, columns: np.ndarray) -> np.ndarray:
        """idf of feature columns: max(0, log((N - Nt + .5) / (Nt + .5)))."""
        nt = (self.indptr[columns + 1] - self.indptr[columns]).astype(np.float64)
        return np.maximum(0.0, np.log((self.n_docs - nt + 0.5) / (nt + 0.5)))

    def scores(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """(documents, scores) of every document sharing a weighted feature with `query`, unsorted."""
        counted = Counter(ngram_hashes(query))
        if not counted or not len(self.hashes):
            return np.zeros(0, np.int64), np.zeros(0)
        qh = np.fromiter(counted.keys(), np.int64)
        qtf = np.fromiter(counted.values(), np.float64)
        cols = np.minimum(np.searchsorted(self.hashes, qh), len(self.hashes) - 1)
        found = self.hashes[cols] == qh
        cols, qtf = cols[found], qtf[found]
        idf = self.idf(cols)
        docs, vals = [], []
        for c, weight in zip(cols, np.log1p(qtf) * idf * idf):  # query weight times document idf
            lo, hi = self.indptr[c], self.indptr[c + 1]
            docs.append(self.docs[lo:hi])
            vals.append(self.logtf[lo:hi] * weight)
        if not docs:
            return np.zeros(0, np.int64), np.zeros(0)
        unique, inverse = np.unique(np.concatenate(docs), return_inverse=True)
        return unique.astype(np.int64), np.bincount(inverse, weights=np.concatenate(vals))

    def top(self, query: str, n: int) -> list[int]:
        """The `n` best-scoring documents (score > 0), best first, ties broken by document order."""
        docs, scores = self.scores(query)
        keep = scores > 0
        docs, scores = docs[keep], scores[keep]
        order = np.lexsort((docs, -scores))[:n]
        return docs[order].tolist()


def select_documents(store: Datastore, index: TfidfIndex, question: str, subject: str | None, n_docs: int) -> list[int]:
    """Documents for a question: the one titled `subject` when there is one, else the top `n_docs` by TF-IDF.

    The query is the subject for knowledge-base questions, else the question without mask and punctuation.
    """
    if subject:
        titled = store.find_title(subject)
        if titled is not None:
            return [titled]
    return index.top(subject or question_query(question), n_docs)
