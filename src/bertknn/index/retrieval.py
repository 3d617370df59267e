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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from itertools import pairwise
from pathlib import Path
from tokenize import TokenError

import numpy as np
from sklearn.utils import murmurhash3_32

from bertknn.index import parts
from bertknn.index.merging import FACTOR, merge_plan
from bertknn.index.parts import open_listed
from bertknn.store import atomic
from bertknn.store.datastore import Datastore, DatastoreError
from bertknn.store.records import Part, versions
from bertknn.text import MASK, normalize_title, stopwords

NUM_BUCKETS = 2**24
TOKEN_RE = re.compile(r"\w+|[^\w\s]")  # DrQA's simple tokenizer: runs of word characters, or one other character
FILES = ("tfidf_hashes.npy", "tfidf_indptr.npy", "tfidf_docs.npy", "tfidf_logtf.npy")
SEGMENT_PREFIX = "tfidf_add_"
NDOCS = "tfidf_ndocs.txt"
KIND = "tfidf"  # the IR index's parts in the datastore's commit point
BASE = "."  # the name of the segment from document 0 written in the datastore directory itself
MERGE_CHUNK = 1 << 22  # entries a merge holds in memory at a time (about 100 MB)
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


@dataclass(frozen=True)
class Segment:
    """log1p(count) per (feature, document) for a run of documents, column-wise: feature -> documents."""

    hashes: np.ndarray  # uint32, sorted: the features that occur
    indptr: np.ndarray  # int64, column c holds docs[indptr[c]:indptr[c + 1]]
    docs: np.ndarray  # int32 document indices (absolute)
    logtf: np.ndarray  # float32
    offset: int = 0  # added to `docs`: the documents of the shards before this one's (a sharded datastore)

    def lookup(self, qh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(column of each query feature, whether the segment has it)."""
        if not len(self.hashes):
            return np.zeros(len(qh), np.int64), np.zeros(len(qh), bool)
        qh = qh.astype(self.hashes.dtype)  # another dtype would convert (copy) the whole column list per query
        cols = np.minimum(np.searchsorted(self.hashes, qh), len(self.hashes) - 1)
        return cols, self.hashes[cols] == qh


def _repair(part: Path) -> str:
    """What to do about a damaged segment (`part`: its folder, or the datastore directory for the base)."""
    directory = part.parent if part.name.startswith(SEGMENT_PREFIX) else part
    return f"`bertknn repair {directory}` rebuilds it from the stored documents (`bertknn verify` checks the store)"


def _load_segment(part: Path) -> Segment:
    """A segment's arrays, memory-mapped and checked for the shapes that make them one index."""
    arrays = []
    for name in FILES:
        try:
            arrays.append(np.load(part / name, mmap_mode="r"))
        # numpy's header parser raises TokenError or SyntaxError, not ValueError, for some damaged headers
        except (ValueError, OSError, EOFError, TokenError, SyntaxError) as err:
            if isinstance(err, FileNotFoundError):
                raise
            raise DatastoreError(f"{part / name} is damaged ({err}); {_repair(part)}") from None
    segment = Segment(*arrays)
    ok = (
        segment.hashes.ndim == segment.indptr.ndim == segment.docs.ndim == segment.logtf.ndim == 1
        and len(segment.indptr) == len(segment.hashes) + 1
        and len(segment.docs) == len(segment.logtf)
        and (len(segment.indptr) == 0 or segment.indptr[-1] == len(segment.docs))
    )
    if not ok:
        raise DatastoreError(f"the IR index in {part} is damaged (its arrays do not fit together); {_repair(part)}")
    return segment


@dataclass(frozen=True)
class _Found:
    """A segment found by listing the directory (a datastore made before its parts were committed): the directory
    itself (the base, from document 0) or a segment folder, `tfidf_add_{first}` (its end in tfidf_ndocs.txt) or,
    made by a merge, `tfidf_add_{first}_{end}`."""

    path: Path
    first: int
    end: int | None  # None: read from tfidf_ndocs.txt

    @property
    def files(self) -> list[Path]:
        return [self.path / name for name in (*FILES, NDOCS)]

    def read_end(self) -> int:
        """The document after the last this part indexes."""
        if self.end is not None:
            return self.end
        try:
            return int((self.path / NDOCS).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path} has no IR index ({NDOCS} missing): rerun `bertknn build`") from None
        except (ValueError, UnicodeDecodeError):
            raise DatastoreError(f"{self.path / NDOCS} is damaged; {_repair(self.path)}") from None


def _found(directory: Path) -> list[_Found]:
    """The segments on disk (half-written `.tmp` folders skipped), in document order, larger ranges first."""
    parts = [_Found(directory, 0, None)] if any((directory / n).exists() for n in (*FILES, NDOCS)) else []
    for folder in directory.glob(f"{SEGMENT_PREFIX}*"):
        bounds = folder.name[len(SEGMENT_PREFIX) :].split("_")
        if folder.is_dir() and all(b.isdigit() for b in bounds) and len(bounds) in (1, 2):
            parts.append(_Found(folder, int(bounds[0]), int(bounds[1]) if len(bounds) == 2 else None))
    return sorted(parts, key=lambda p: (p.first, -(p.end or 0), p.path != directory))


def listing(directory: Path) -> list[Part]:
    """The parts of a datastore made before its parts were committed, from its directory: those that index
    documents 0.. without overlap (a merged segment before the segments it replaced; what a gap cuts off is not
    read). A writer commits this list once (`build.writer`), readers of such a store use it until then."""
    chosen, pos = [], 0
    for part in _found(directory):
        if part.first == pos:
            pos = part.read_end()
            chosen.append(Part(BASE if part.path == directory else part.path.name, part.first, pos))
    return chosen


def on_disk(directory: Path) -> list[str]:
    """The names of the segments on disk, listed or not (for `retire`: half-written `.tmp` folders excluded)."""
    return [
        BASE if part.path == directory else part.path.name
        for part in _found(directory)
        if not part.path.name.endswith(atomic.TMP)
    ]


def is_written(directory: Path, part: Part) -> bool:
    """Whether a listed segment's files are there (tfidf_ndocs.txt is written last)."""
    return (_path(directory, part.name) / NDOCS).is_file()


def top_names(listed: list[Part]) -> list[str]:
    """The files and folders of the datastore directory that hold the listed segments (what a copy takes)."""
    return [name for part in listed for name in ([*FILES, NDOCS] if part.name == BASE else [part.name])]


def _path(directory: Path, name: str) -> Path:
    return directory if name == BASE else directory / name


def part_files(name: str) -> list[str]:
    """A segment's files relative to the datastore."""
    return [*FILES, NDOCS] if name == BASE else [f"{name}/{file}" for file in (*FILES, NDOCS)]


def delete(store: Datastore, name: str) -> None:
    """Delete a segment no list names, its checksums dropped first (so its absence is not taken for damage)."""
    store.rewriting(*part_files(name))
    if name == BASE:
        for file in part_files(BASE):
            (store.path / file).unlink(missing_ok=True)
    else:
        shutil.rmtree(store.path / name, ignore_errors=True)


def retire(store: Datastore) -> list[str]:
    """Delete the segments that the committed list does not name (`parts.retire`)."""
    return parts.retire(store, KIND, on_disk(store.path), partial(delete, store))


def _folder(first: int, end: int | None = None) -> str:
    """The name of a segment folder: `tfidf_add_{first}` (an added segment), `tfidf_add_{first}_{end}` (a merge)."""
    return f"{SEGMENT_PREFIX}{first:09d}" + ("" if end is None else f"_{end:09d}")


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
        return names if first == 0 else [f"{_folder(first)}/{name}" for name in names]

    def save(self, directory: str | Path, first: int = 0) -> Part:
        """Write a one-segment index: documents from 0 as the base files, else as a segment folder (renamed whole);
        return the part to commit."""
        (segment,) = self.segments
        directory = Path(directory)
        target = directory if first == 0 else directory / _folder(first)
        out = target if first == 0 else atomic.new_folder(target)
        for name, array in zip(FILES, (segment.hashes, segment.indptr, segment.docs, segment.logtf)):
            atomic.write_file(out / name, partial(np.save, arr=array))
        atomic.write_text(out / NDOCS, str(self.n_docs))  # last: a base without it is not an index yet
        if out != target:
            atomic.publish(out, target)
        return Part(BASE if first == 0 else target.name, first, self.n_docs)

    @classmethod
    def load(cls, store: Datastore) -> TfidfIndex:
        """Open the datastore's index as its commit point lists it (`parts.open_listed`), memory-mapped."""
        return open_listed(
            store, KIND, partial(cls.open, store.path), lambda: cls.open(store.path, listing(store.path))
        )

    @classmethod
    def load_shards(cls, stores: list[Datastore], first_documents: list[int]) -> TfidfIndex:
        """One index over the indexes of a sharded datastore's shards, each shard's documents numbered after those
        of the shards before it: document frequencies are summed over all, so scores equal one index's over all."""
        segments, sizes, n_docs = [], [], 0
        for store, first in zip(stores, first_documents, strict=True):
            shard = cls.load(store)
            segments += [replace(seg, offset=first) for seg in shard.segments]
            sizes += shard.sizes
            n_docs = first + shard.n_docs
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
            segments.append(_open_part(directory, part))
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


def _open_part(directory: Path, part: Part) -> Segment:
    """One listed segment, checked to be whole and to index the documents it is listed for."""
    path = _path(directory, part.name)
    missing = [f.name for f in _Found(path, part.first, None).files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"{path} has no IR index ({', '.join(missing)} missing): {_repair(path)}")
    if _Found(path, part.first, None).read_end() != part.stop:
        raise DatastoreError(
            f"the IR index segment {path} does not index documents {part.first}..{part.stop}; {_repair(path)}"
        )
    return _load_segment(path)


def listed(store: Datastore) -> list[Part]:
    """The segments readers open: the committed list, or in a datastore made before lists, the `listing` of its
    directory (none where that cannot be read)."""
    committed = store.parts(KIND)
    if committed is not None:
        return committed
    try:
        return listing(store.path)
    except (FileNotFoundError, DatastoreError):
        return []


def damaged_parts(store: Datastore, files: Iterable[str] = (), parts: list[Part] | None = None) -> list[Part]:
    """Those of the segments readers open (`parts`, else `listed`) that a reader cannot open (a file missing or
    unreadable, arrays that do not fit, tfidf_ndocs.txt not as listed) or that hold any of `files` (names relative to
    the datastore: damage their checksums found), in document order (`bertknn repair` indexes them again)."""
    files = set(files)
    found = []
    for part in listed(store) if parts is None else parts:
        try:
            _open_part(store.path, part)
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
    name = _folder(part.first) if part.name == _folder(part.first, part.stop) else _folder(part.first, part.stop)
    target = store.path / name
    delete(store, name)  # what an interrupted repair or merge left under that name: no list holds it
    scratch = atomic.new_folder(store.path / f"{name}_pieces")  # deleted by the next writer if this one is killed
    try:
        segments, end = [], part.first
        for first in range(part.first, part.stop, segment_docs):
            stop = min(first + segment_docs, part.stop)
            piece = TfidfIndex.build(store.iter_document_texts(first, stop), first)
            end = piece.n_docs
            if piece.n_docs != stop:
                break
            if piece.segments:
                saved = piece.save(scratch, first)
                segments.append(_load_segment(_path(scratch, saved.name)))
        if end != part.stop:
            raise DatastoreError(
                f"{store.path / 'store.sqlite'} lacks the text of documents of {part.first}..{part.stop}: it is "
                "damaged; `bertknn verify` checks it"
            )
        tmp = atomic.new_folder(target)
        _write_merged(segments, tmp, part.stop, chunk_entries)
        atomic.publish(tmp, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Part(name, part.first, part.stop)


def _write_merged(segments: list[Segment], out: Path, n_docs: int, chunk_entries: int) -> None:
    """One segment from segments of consecutive documents, written into `out` in hash ranges of about
    `chunk_entries` entries, so memory is bounded by a range, not by the merged size."""
    mark = np.zeros(NUM_BUCKETS, bool)
    for seg in segments:
        mark[np.asarray(seg.hashes)] = True
    hashes = np.flatnonzero(mark).astype(np.uint32)
    del mark
    total = sum(len(seg.docs) for seg in segments)
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_file(out / FILES[0], partial(np.save, arr=hashes))
    indptr = atomic.new_npy(out / FILES[1], np.int64, len(hashes) + 1)
    docs = atomic.new_npy(out / FILES[2], np.int32, total)
    logtf = atomic.new_npy(out / FILES[3], np.float32, total)
    indptr[0] = pos = 0
    bounds = np.linspace(0, len(hashes), max(1, -(-total // chunk_entries)) + 1).astype(np.int64)
    for a, b in pairwise(bounds):
        if a == b:
            continue
        cols = hashes[a:b]
        counts = np.zeros(len(cols), np.int64)
        parts_docs, parts_tf, parts_col = [], [], []
        for seg in segments:
            lo, hi = np.searchsorted(seg.hashes, [cols[0], cols[-1] + 1])
            if lo == hi:
                continue
            where = np.searchsorted(cols, seg.hashes[lo:hi])
            lengths = np.diff(seg.indptr[lo : hi + 1])
            counts[where] += lengths
            e0, e1 = seg.indptr[lo], seg.indptr[hi]
            parts_docs.append(seg.docs[e0:e1])
            parts_tf.append(seg.logtf[e0:e1])
            parts_col.append(np.repeat(where, lengths))
        order = np.argsort(np.concatenate(parts_col), kind="stable")  # segments in document order: docs stay sorted
        n = int(counts.sum())
        docs[pos : pos + n] = np.concatenate(parts_docs)[order]
        logtf[pos : pos + n] = np.concatenate(parts_tf)[order]
        indptr[a + 1 : b + 1] = pos + np.cumsum(counts)
        pos += n
    for array in (indptr, docs, logtf):
        array.flush()
    del indptr, docs, logtf
    atomic.write_text(out / NDOCS, str(n_docs))


def compact(
    directory: Path,
    listed: list[Part],
    forget: Callable[[list[str]], None] = lambda names: None,
    factor: int = FACTOR,
    chunk_entries: int = MERGE_CHUNK,
) -> list[Part]:
    """Merge runs of the segments `listed` as `merge_plan` says; return the list with each run replaced by its
    merge. For the writer of the datastore, who commits the list (`Datastore.commit_parts`, or `publish` with the
    documents it indexes) and then `retire`s what it replaced: each merged segment is written whole (a `.tmp` folder
    renamed) under a name no list holds, so readers never wait and a crash leaves the committed index as it was.
    `forget` (the store's `rewriting`) is told the files about to be written anew.
    """
    atomic.remove_temporary(directory, f"{SEGMENT_PREFIX}*")
    listed = list(listed)
    while (run := merge_plan([p.stop - p.first for p in listed], factor)) is not None:
        picked = listed[run[0] : run[1]]
        merged = Part(_folder(picked[0].first, picked[-1].stop), picked[0].first, picked[-1].stop)
        forget(part_files(merged.name))  # a leftover of an interrupted merge is written anew
        tmp = atomic.new_folder(directory / merged.name)
        segments = [_load_segment(_path(directory, part.name)) for part in picked]
        _write_merged(segments, tmp, merged.stop, chunk_entries)
        atomic.publish(tmp, directory / merged.name)
        listed[run[0] : run[1]] = [merged]
    return listed


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
    store: Datastore, index: TfidfIndex, question: str, subject: str | None, n_docs: int, named: bool = True
) -> Selected:
    """Documents for a question and their retrieval scores: every live document titled `subject` when there is one
    (the paper's title shortcut; several where documents about the subject were added), else the top `n_docs` by
    TF-IDF, with `named` those alone that name the question's entity (`TfidfIndex.about`; the paper keeps all).

    The query is the subject for knowledge-base questions, else the question without mask and punctuation.
    """
    if subject:
        titled = [doc for doc, _ in store.find_titles(normalize_title(subject))]
        if titled:
            return Selected(titled, [1.0] * len(titled), [titled], subject if named else None)
    hidden = store.hidden_documents()
    docs, scores = index.ranked(subject or question_query(question), n_docs, hidden)
    about = index.about(docs, names(question, subject) if named else [], hidden)  # another entity's never answers
    docs, scores = [d for d, a in zip(docs, about) if a], [s for s, a in zip(scores, about) if a]
    return Selected(docs, scores, versions(docs, store.dated_titles(docs)))
