"""Text stage: read a corpus, split it into sentences and pick the words the datastore stores (SPEC §1).

A target is a word that the model's tokenizer turns into exactly one token, that is not a stopword (scikit-learn's
English list) and not punctuation. Each sentence is tokenized once; a masked context is that token sequence with
the target's id replaced by the mask id, never a sentence rebuilt from wordpieces.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

STOPWORDS: frozenset[str] = frozenset(ENGLISH_STOP_WORDS)
MASK = "[MASK]"


class CorpusError(ValueError):
    """A corpus file that cannot be used as it is; the message names the file and line."""


@dataclass(frozen=True)
class Document:
    """One document of the text collection: a unique id, a title and its text passages."""

    id: str
    title: str
    passages: tuple[str, ...]


@dataclass(frozen=True)
class Sentence:
    """A tokenized sentence and its targets (token positions, token ids and character spans in `text`)."""

    text: str
    input_ids: np.ndarray  # int64 [CLS] ... [SEP]
    positions: np.ndarray  # int32 token positions of the targets
    spans: np.ndarray  # int32 (n, 2) character spans of the targets in `text`

    @property
    def target_ids(self) -> np.ndarray:
        """The vocabulary ids of the targets: the datastore's values."""
        return self.input_ids[self.positions].astype(np.int32)


def normalize_title(title: str) -> str:
    """Normalise a title or subject for the title shortcut: NFKC, case-folded, single spaces."""
    return " ".join(unicodedata.normalize("NFKC", title).casefold().split())


def _parse_line(line: str, where: str) -> Document:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise CorpusError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
    return parse_document(obj, where)


def parse_document(obj: object, where: str) -> Document:
    """A Document from one corpus object {id, title, text | sentences}; CorpusError naming `where` otherwise."""
    if not isinstance(obj, dict):
        raise CorpusError(f"{where}: expected a JSON object with id, title and text")
    doc_id, title = obj.get("id"), obj.get("title")
    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool) or str(doc_id) == "":
        raise CorpusError(f"{where}: missing or empty 'id' (a string or integer)")
    if not isinstance(title, str):
        raise CorpusError(f"{where}: missing 'title' (a string)")
    text = obj.get("text", obj.get("sentences"))
    passages = [text] if isinstance(text, str) else text
    if not isinstance(passages, list) or not all(isinstance(p, str) for p in passages):
        raise CorpusError(f"{where}: 'text' must be a string (or 'sentences' a list of strings)")
    passages = [p.strip() for p in passages if p.strip()]
    if not passages:
        raise CorpusError(f"{where}: document {doc_id!r} has no text")
    return Document(str(doc_id), title.strip(), tuple(passages))


def iter_corpus(path: str | Path) -> Iterator[Document]:
    """Stream the documents of a JSONL corpus ({id, title, text} per line), raising CorpusError on a bad line."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: no such corpus file")
    seen: set[str] = set()
    count = 0
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            doc = _parse_line(line, f"{path}:{number}")
            if doc.id in seen:
                raise CorpusError(f"{path}:{number}: duplicate document id {doc.id!r}")
            seen.add(doc.id)
            count += 1
            yield doc
    if count == 0:
        raise CorpusError(f"{path}: the corpus is empty (expected one JSON document per line)")


def validate_corpus(path: str | Path) -> int:
    """Read the whole corpus once and return its document count, so a bad line fails before anything is written."""
    return sum(1 for _ in iter_corpus(path))


@lru_cache(maxsize=1)
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False)


def split_sentences(passage: str) -> list[str]:
    """Split a passage into sentences with pysbd (rule-based, knows "U.S." and "3.5")."""
    return [s.strip() for s in _segmenter().segment(passage) if s.strip()]


def is_content_word(word: str) -> bool:
    """True for a word that may be a target: not a stopword and not punctuation."""
    return any(ch.isalnum() for ch in word) and word.lower() not in STOPWORDS


def tokenize_sentences(tokenizer, sentences: list[str], max_length: int = 128) -> list[Sentence]:
    """Tokenize sentences once each and find their targets: one-token, non-stopword, non-punctuation words."""
    if not sentences:
        return []
    enc = tokenizer(
        sentences, truncation=True, max_length=max_length, return_offsets_mapping=True, add_special_tokens=True
    )
    special = set(tokenizer.all_special_ids)
    out = []
    for i, text in enumerate(sentences):
        ids = enc["input_ids"][i]
        word_ids = enc.word_ids(i)
        counts: dict[int, int] = {}
        for w in word_ids:
            if w is not None:
                counts[w] = counts.get(w, 0) + 1
        positions, spans = [], []
        for pos, (w, (start, end)) in enumerate(zip(word_ids, enc["offset_mapping"][i])):
            if w is not None and counts[w] == 1 and ids[pos] not in special and is_content_word(text[start:end]):
                positions.append(pos)
                spans.append((start, end))
        out.append(
            Sentence(
                text,
                np.asarray(ids, dtype=np.int64),
                np.asarray(positions, dtype=np.int32),
                np.asarray(spans, dtype=np.int32).reshape(-1, 2),
            )
        )
    return out


def mask_count_error(text: str, mask: str = MASK) -> str | None:
    """Return why `text` is not a cloze question with exactly one mask, or None when it is one."""
    n = text.count(mask)
    if n == 1:
        return None
    if n == 0:
        return (
            f"the question has no {mask}: write the word to predict as {mask}, e.g. 'Paris is the capital of {mask}.'"
        )
    return f"the question has {n} {mask} tokens; BERT-kNN predicts exactly one {mask} per question"
