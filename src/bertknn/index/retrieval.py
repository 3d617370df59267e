"""Retrieval stage: DrQA-style TF-IDF document ranking and the title shortcut (SPEC §2).

Features are unigrams and bigrams of lowercased tokens, an n-gram dropped when any of its tokens is a stopword or
punctuation, hashed with unsigned murmur3 (scikit-learn's) modulo 2^24. A document's weight for a feature is
log1p(count) * idf, idf = max(0, log((N - Nt + .5) / (Nt + .5))); a query is weighted the same way and scored by
the sparse dot product. The index stores log1p(count) per (feature, document) in compressed sparse columns over the
features that occur, as .npy files opened with mmap; idf is computed from the column lengths at query time, so
appending documents (a new segment) needs no re-weighting. Segments are merged as they pile up (`compact`, a log
merge policy as Lucene's), streaming by hash range, so a query reads few segments at any corpus size and a merge's
memory is bounded. Documents that are being added or were removed are never returned.
"""

from __future__ import annotations

import re
import shutil
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from pathlib import Path

import numpy as np
from sklearn.utils import murmurhash3_32

from bertknn.index.parts import open_listed
from bertknn.index.tfidf_files import (
    BASE,
    FILES,
    KIND,
    MERGE_CHUNK,
    NDOCS,
    NUM_BUCKETS,
    Segment,
    delete,
    folder_name,
    listed,
    listing,
    load_segment,
    open_part,
    part_files,
    segment_path,
    write_merged,
)
from bertknn.store import atomic
from bertknn.store.datastore import Datastore, DatastoreError
from bertknn.store.protocol import Store
from bertknn.store.records import Part, newest_first, versions
from bertknn.text import MASK, normalize_title, stopwords

TOKEN_RE = re.compile(r"\w+|[^\w\s]")  # DrQA's simple tokenizer: runs of word characters, or one other character
SEGMENT_DOCS = 5000  # documents per segment written at a time by a writer: memory stays bounded by one segment


def tokenize(text: str) -> list[str]:
    """Lowercased, NFKC-normalised word and punctuation tokens."""
    return TOKEN_RE.findall(unicodedata.normalize("NFKC", text).lower())


@lru_cache(maxsize=1 << 20)  # words repeat (Zipf): a cached answer is one dict lookup
def _keep(token: str) -> bool:
    return token not in stopwords() and any(ch.isalnum() for ch in token)


def ngram_hashes(text: str) -> list[int]:
    """Hashed unigram and bigram features of `text` (with repeats), stopword and punctuation n-grams dropped."""
    tokens = tokenize(text)
    keep = [_keep(t) for t in tokens]
    grams = [t for t, k in zip(tokens, keep) if k]
    grams += [f"{a} {b}" for a, b, ka, kb in zip(tokens, tokens[1:], keep, keep[1:]) if ka and kb]
    return [murmurhash3_32(g, positive=True) % NUM_BUCKETS for g in grams]


def feature_array(text: str) -> np.ndarray:
    """`ngram_hashes` of a text as an array (what `TfidfIndex.from_features` takes)."""
    return np.asarray(ngram_hashes(text), np.int64)


def question_query(question: str) -> str:
    """IR query text of a free cloze question: the question without its mask and sentence punctuation."""
    return re.sub(r"[^\w\s]", " ", question.replace(MASK, " ")).strip()


def names(text: str, subject: str | None = None) -> list[str]:
    """The words that name the entity a question is about, as `tokenize` gives them: the subject's words that are not
    stopwords, else the question's capitalised ones ("Michel Rocard is a native speaker of [MASK]" -> michel,
    rocard)."""
    if subject:
        return [t for t in tokenize(subject) if _keep(t)]
    words = TOKEN_RE.findall(unicodedata.normalize("NFKC", text.replace(MASK, " ")))
    return [w.lower() for w in words if w[:1].isupper() and _keep(w.lower())]


class TfidfIndex:
    """Hashed TF-IDF over documents 0..N-1: a base segment plus segments of added documents, merged as they pile up.

    Added documents get their own segment (written once, never rewritten); `compact` replaces a run of segments by
    one (`merging.merge_plan` picks runs as Lucene's log merge policy does), so a query reads a number of segments that
    grows with the logarithm of the corpus. idf sums the document frequencies of all segments, so an index built in
    parts scores like one built at once.
    """

    def __init__(self, segments: list[Segment], n_docs: int, sizes: list[int] | None = None) -> None:
        self.segments, self.n_docs = segments, n_docs
        self.sizes = sizes if sizes is not None else [n_docs]  # documents per segment, in order

    @classmethod
    def build(cls, texts: Iterable[str], first: int = 0) -> TfidfIndex:
        """Index documents given in order: the i-th text is document `first + i`."""
        return cls.from_features(map(feature_array, texts), first)

    @classmethod
    def from_features(cls, features: Iterable[np.ndarray], first: int = 0) -> TfidfIndex:
        """Index documents given as their hashed features (with repeats, `ngram_hashes`): one sort of all
        (feature, document) pairs gives the counts in column order."""
        pairs = [np.asarray(h, np.int64) << 32 | i for i, h in enumerate(features)]
        n = len(pairs)
        if not n:
            return cls([], first, [])
        key, counts = np.unique(np.concatenate(pairs), return_counts=True)
        hashes, starts = np.unique(key >> 32, return_index=True)
        segment = Segment(
            hashes.astype(np.uint32),
            np.append(starts, len(key)).astype(np.int64),
            ((key & 0xFFFFFFFF) + first).astype(np.int32),
            np.log1p(counts.astype(np.float32)),
        )
        return cls([segment], first + n, [n])

    @staticmethod
    def files(first: int) -> list[str]:
        """The files (relative to the datastore) that `save(..., first)` writes."""
        names = [*FILES, NDOCS]
        return names if first == 0 else [f"{folder_name(first)}/{name}" for name in names]

    def save(self, directory: str | Path, first: int = 0) -> Part:
        """Write a one-segment index: documents from 0 as the base files, else as a segment folder (renamed whole);
        return the part to commit."""
        (segment,) = self.segments
        directory = Path(directory)
        target = directory if first == 0 else directory / folder_name(first)
        out = target if first == 0 else atomic.new_folder(target)
        for name, array in zip(FILES, (segment.hashes, segment.indptr, segment.docs, segment.logtf)):
            atomic.write_file(out / name, partial(np.save, arr=array))
        atomic.write_text(out / NDOCS, str(self.n_docs))  # last: a base without it is not an index yet
        if out != target:
            atomic.publish(out, target)
        return Part(BASE if first == 0 else target.name, first, self.n_docs)

    @classmethod
    def load(cls, store: Store) -> TfidfIndex:
        """Open the datastore's index as its commit point lists it (`parts.open_listed`), memory-mapped: over its
        shards (`protocol.Shards`), each shard's documents numbered after those of the shards before it, so that
        document frequencies sum over all and scores equal one index's over all."""
        segments, sizes, n_docs = [], [], 0
        for shard, first in zip(store.shards, store.doc_starts[:-1].tolist()):
            one = open_listed(shard, KIND, partial(cls.open, shard.path), partial(_open_unlisted, cls, shard.path))
            segments += [replace(seg, offset=seg.offset + first) for seg in one.segments]
            sizes += one.sizes
            n_docs = first + one.n_docs
        return cls(segments, n_docs, sizes)

    @classmethod
    def open(cls, directory: Path, parts: list[Part]) -> TfidfIndex:
        """Exactly these segments, which must index documents 0.. in order, each as long as listed."""
        if not parts:
            raise FileNotFoundError(f"{directory} has no IR index ({FILES[0]} missing): rerun `bertknn build`")
        segments, pos = [], 0
        for part in parts:
            if part.first != pos:
                raise DatastoreError(f"the IR index of {directory} lists no segment of documents {pos}..{part.first}")
            segments.append(open_part(directory, part))
            pos = part.stop
        return cls(segments, pos, [p.stop - p.first for p in parts])

    def idf(self, nt: np.ndarray, n_docs: int | None = None) -> np.ndarray:
        """idf from document frequencies: max(0, log((N - Nt + .5) / (Nt + .5))), N the documents indexed (or
        `n_docs`: those live)."""
        nt = np.asarray(nt, np.float64)
        n = self.n_docs if n_docs is None else n_docs
        return np.maximum(0.0, np.log((n - nt + 0.5) / (nt + 0.5)))

    def scores(self, query: str | np.ndarray, hidden: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(documents, scores) of every document sharing a weighted feature with `query` (a text, or its hashed
        features as `ngram_hashes` gives them), unsorted. Documents `hidden` (removed, or being added) count in no
        idf, so that removing what was added gives every score back as it was (an edit undone leaves no trace)."""
        features = np.asarray(ngram_hashes(query) if isinstance(query, str) else query, np.int64)
        if not len(features):
            return np.zeros(0, np.int64), np.zeros(0)
        qh, counts = np.unique(features, return_counts=True)
        found = [(seg, *seg.lookup(qh)) for seg in self.segments]
        hidden = hidden[hidden < self.n_docs] if hidden is not None and len(hidden) else None
        nt = np.zeros(len(qh), np.int64)
        for seg, cols, has in found:  # a segment may hold no feature at all (documents of stopwords only)
            nt[has] += seg.indptr[cols[has] + 1] - seg.indptr[cols[has]]
            if hidden is not None:
                for i in np.flatnonzero(has):
                    lo, hi = seg.indptr[cols[i]], seg.indptr[cols[i] + 1]
                    nt[i] -= np.count_nonzero(np.isin(seg.docs[lo:hi] + seg.offset, hidden))
        live = self.n_docs - (len(hidden) if hidden is not None else 0)
        weight = np.log1p(counts.astype(np.float64)) * self.idf(nt, live) ** 2  # query weight x document idf
        docs, vals = [], []
        for seg, cols, has in found:
            for c, w in zip(cols[has], weight[has]):
                lo, hi = seg.indptr[c], seg.indptr[c + 1]
                docs.append(seg.docs[lo:hi] + seg.offset if seg.offset else seg.docs[lo:hi])
                vals.append(seg.logtf[lo:hi] * w)
        if not docs:
            return np.zeros(0, np.int64), np.zeros(0)
        unique, inverse = np.unique(np.concatenate(docs), return_inverse=True)
        return unique.astype(np.int64), np.bincount(inverse, weights=np.concatenate(vals))

    def ranked(
        self, query: str | np.ndarray, n: int, hidden: np.ndarray | None = None
    ) -> tuple[list[int], list[float]]:
        """The `n` best-scoring documents (score > 0, not `hidden`), best first, ties broken by document order, and
        their scores."""
        docs, scores = self.scores(query, hidden)
        keep = scores > 0
        if hidden is not None and len(hidden):
            keep &= ~np.isin(docs, hidden)
        docs, scores = docs[keep], scores[keep]
        order = np.lexsort((docs, -scores))[:n]
        return docs[order].tolist(), scores[order].tolist()

    def containing(self, word: str) -> np.ndarray:
        """The documents whose text holds `word` (a token of `tokenize`), from its unigram feature's columns."""
        qh = np.asarray([murmurhash3_32(word, positive=True) % NUM_BUCKETS], np.int64)
        found = [
            seg.docs[seg.indptr[c] : seg.indptr[c + 1]] + seg.offset
            for seg in self.segments
            for (c,), (has,) in [seg.lookup(qh)]
            if has
        ]
        return np.concatenate(found).astype(np.int64) if found else np.zeros(0, np.int64)

    def about(self, docs: list[int], names: list[str], hidden: np.ndarray | None = None) -> list[bool]:
        """Whether each of `docs` is about the entity `names` name: holds every one of the names (Julian Lennon's
        document is not about John Lennon; none where a name is in no document: the datastore knows nothing of that
        entity). All True without names: nothing tells the documents apart. Documents `hidden` hold no name."""
        keep = np.ones(len(docs), bool)
        for word in dict.fromkeys(names):
            found = self.containing(word)
            if hidden is not None and len(hidden):
                found = found[~np.isin(found, hidden)]
            keep &= np.isin(docs, found)
        return keep.tolist()

    def top(self, query: str | np.ndarray, n: int, hidden: np.ndarray | None = None) -> list[int]:
        """The documents of `ranked`."""
        return self.ranked(query, n, hidden)[0]


def damaged_parts(store: Datastore, files: Iterable[str] = (), parts: list[Part] | None = None) -> list[Part]:
    """Those of the segments readers open (`parts`, else `listed`) that a reader cannot open (a file missing or
    unreadable, arrays that do not fit, tfidf_ndocs.txt not as listed) or that hold any of `files` (names relative to
    the datastore: damage their checksums found), in document order (`bertknn repair` indexes them again)."""
    files = set(files)
    found = []
    for part in listed(store) if parts is None else parts:
        try:
            open_part(store.path, part, kept=False)
        except (FileNotFoundError, DatastoreError):
            found.append(part)
            continue
        if files & set(part_files(part.name)):
            found.append(part)
    return found


def rebuilt(store: Datastore, part: Part, segment_docs: int = SEGMENT_DOCS, chunk_entries: int = MERGE_CHUNK) -> Part:
    """The listed segment `part` indexed again from the stored text of the documents it covers (`bertknn repair`),
    written whole (a `.tmp` folder renamed) under the other name of its range, `tfidf_add_{first}_{stop}` or
    `tfidf_add_{first}`, which no list holds; return it, for the writer to commit in place of `part` and then
    `retire` the old one. Its arrays equal those the writers made: documents are hashed `segment_docs` at a time into
    pieces that are then merged as `compact` merges, so memory stays bounded by a piece and a merge's hash range."""
    name = (
        folder_name(part.first)
        if part.name == folder_name(part.first, part.stop)
        else folder_name(part.first, part.stop)
    )
    target = store.path / name
    delete(store, name)  # what an interrupted repair or merge left under that name: no list holds it
    scratch = atomic.new_folder(store.path / f"{name}_pieces")  # deleted by the next writer if this one is killed
    try:
        segments, end = [], part.first
        for first in range(part.first, part.stop, segment_docs):
            stop = min(first + segment_docs, part.stop)
            piece = TfidfIndex.build(store.documents.texts(first, stop), first)
            end = piece.n_docs
            if piece.n_docs != stop:
                break
            if piece.segments:
                saved = piece.save(scratch, first)
                segments.append(load_segment(segment_path(scratch, saved.name)))
        if end != part.stop:
            raise DatastoreError(
                f"{store.path / 'store.sqlite'} lacks the text of documents of {part.first}..{part.stop}: it is "
                "damaged; `bertknn verify` checks it"
            )
        tmp = atomic.new_folder(target)
        write_merged(segments, tmp, part.stop, chunk_entries)
        atomic.publish(tmp, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Part(name, part.first, part.stop)


def problems(directory: Path) -> list[str]:
    """What would keep a reader from opening the IR index of a datastore directory (`bertknn verify`): a listed
    segment missing, its unreadable array or tfidf_ndocs.txt. A store without an index has none: its next writer
    builds it."""
    store = Datastore(directory, check=False)
    try:
        TfidfIndex.load(store)
    except FileNotFoundError as err:
        return [str(err)] if store.parts(KIND) else []
    except DatastoreError as err:
        return [str(err)]
    finally:
        store.close()
    return []


@dataclass(frozen=True)
class Selected:
    """The documents a question searches and their retrieval scores (TF-IDF's; 1 each for the title shortcut's);
    `versions`: the documents grouped by title, each group newest first (`datastore.versions`), which the vote reads
    as versions of one article rather than rival sources (`knn.version_weights`); `entity`: the subject, where
    `documents` are titled by it and the question's entity is to be told from its name (`named`): a word of the
    subject's name in its own article is not evidence of the subject's facts (`search.DocumentSearch.among`)."""

    documents: list[int]
    scores: list[float] | None
    versions: list[list[int]]
    entity: str | None = None


def select_documents(
    store: Datastore,
    index: TfidfIndex,
    question: str,
    subject: str | None,
    n_docs: int,
    named: bool = True,
    about: bool = True,
) -> Selected:
    """Documents for a question and their retrieval scores: every live document titled `subject` when there is one
    (the paper's title shortcut; several where documents about the subject were added), with `about` also the dated
    documents that name it (`naming`: an update titled as news is one of the subject's documents), all versions of one
    article, newest first; else the top `n_docs` by TF-IDF, with `named` those alone that name the question's entity
    (`TfidfIndex.about`; the paper keeps all).

    The query is the subject for knowledge-base questions, else the question without mask and punctuation.
    """
    if subject:
        norm = normalize_title(subject)
        titled = store.documents.find_titles(norm)
        if titled:
            docs = [doc for doc, _ in titled]
            held = set(docs)
            extra = [d for d in naming(store, index, norm) if d not in held] if about else []
            if extra:
                dated = titled + list(zip(extra, [date for _, date in store.documents.dated_titles(extra)]))
                docs = [doc for doc, _ in newest_first(dated)]
            return Selected(docs, [1.0] * len(docs), [docs], subject if named else None)
    hidden = store.documents.hidden()
    docs, scores = index.ranked(subject or question_query(question), n_docs, hidden)
    about_entity = index.about(docs, names(question, subject) if named else [], hidden)  # not another entity's
    docs, scores = [d for d, a in zip(docs, about_entity) if a], [s for s, a in zip(scores, about_entity) if a]
    return Selected(docs, scores, versions(docs, store.documents.dated_titles(docs)))


def naming(store: Datastore, index: TfidfIndex, norm_title: str) -> list[int]:
    """The live documents added after the build with a date of their own (`Documents.dated`) whose text names the
    subject titled `norm_title` by its title or an alias (holds every word of the name, as `TfidfIndex.about`
    tells), in index order: where a subject's fact changed, a dated item about it takes part in its conflicts
    whatever its own title."""
    dated = store.documents.dated()
    if not len(dated):
        return []
    found: set[int] = set()
    candidates = dated.tolist()
    for name in store.documents.aliases(norm_title):
        words = [t for t in tokenize(name) if _keep(t)]
        if words:
            found |= {d for d, a in zip(candidates, index.about(candidates, words)) if a}
    return sorted(found)


def _open_unlisted(kind: type[TfidfIndex], directory: Path) -> TfidfIndex:
    """The index of a store whose commit point lists no parts (made before it did): the files on disk."""
    return kind.open(directory, listing(directory))
