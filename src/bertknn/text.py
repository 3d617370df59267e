"""Text stage: read a corpus, split it into sentences and pick the words the datastore stores (SPEC §1).

A target is a whole word (as the tokenizer's pre-tokenizer splits words) that is not a stopword (scikit-learn's
English list) and not punctuation, whatever the number of tokens the model's tokenizer turns it into (a datastore of
format 1 took only words of exactly one token). Each sentence is tokenized once; a masked context is that token
sequence with the target's tokens replaced by one mask id (`masked`), the form of a question, never a sentence
rebuilt from wordpieces.
"""

from __future__ import annotations

import datetime
import json
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

MASK = "[MASK]"
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")  # C0 and C1 control characters and DEL


class CorpusError(ValueError):
    """A corpus file that cannot be used as it is; the message names the file and line."""


@dataclass(frozen=True)
class Document:
    """One document of the text collection: a unique id, a title, its text passages, when known its date (ISO 8601,
    `iso_date`: where documents about one subject disagree, the newest one's evidence wins) and the other names of
    its subject (`aliases`, Wikipedia's redirects among them), by which a question may name it."""

    id: str
    title: str
    passages: tuple[str, ...]
    date: str | None = None
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Sentence:
    """A tokenized sentence and its targets: the window each is read in, its position there, its character span.

    A sentence that fits the model's input has one window, all its tokens. A longer one is covered by overlapping
    windows ([CLS] + a slice of its tokens + [SEP]), and each target is read in the window where it has the most
    context on both sides.
    """

    text: str
    windows: tuple[np.ndarray, ...]  # int64 token ids of each window, [CLS] ... [SEP]
    window: np.ndarray  # int32 window of each target
    positions: np.ndarray  # int32 token position of each target's first token in its window
    spans: np.ndarray  # int32 (n, 2) character spans of the targets in `text`
    lengths: np.ndarray  # int32 tokens of each target

    def target_pieces(self) -> list[tuple[int, ...]]:
        """The token ids of each target (one for a word of one wordpiece): what the datastore's values stand for."""
        return [
            tuple(self.windows[w][p : p + n].tolist()) for w, p, n in zip(self.window, self.positions, self.lengths)
        ]

    def window_targets(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Each window's token ids with the indices of the targets read in it (in position order)."""
        for w, ids in enumerate(self.windows):
            yield ids, np.flatnonzero(self.window == w)

    def split(self) -> list[Sentence]:
        """One single-window Sentence per window, with the targets read in that window."""
        return [
            Sentence(self.text, (ids,), np.zeros(len(t), np.int32), self.positions[t], self.spans[t], self.lengths[t])
            for ids, t in self.window_targets()
        ]


def masked(ids: np.ndarray, positions: np.ndarray, lengths: np.ndarray, mask_id: int) -> tuple[np.ndarray, np.ndarray]:
    """`ids` with each target (its first token at `positions`, `lengths` tokens) replaced by one `mask_id`, and the
    masks' positions there: a word of several wordpieces is read as a question asks for it, with one mask."""
    ids = np.asarray(ids)
    if len(positions) == 1:  # one target, as a build reads nearly every context: no boolean mask needed
        p, n = int(positions[0]), int(lengths[0])
        return np.concatenate((ids[:p], np.array([mask_id], ids.dtype), ids[p + n :])), np.array([p])
    keep = np.ones(len(ids), bool)
    for p, n in zip(positions, lengths):
        keep[p + 1 : p + n] = False
    out = ids[keep]
    where = (np.cumsum(keep) - 1)[positions]
    out[where] = mask_id
    return out, where


def printable(text: str) -> str:
    """`text` safe to show in a terminal: each control character (C0, DEL, C1) written as an escape like \\x1b."""
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def eta(remaining: float, rate: float) -> str:
    """The time `remaining` units take at `rate` per second, as 42s, 7m05s or 3h12m (progress lines)."""
    seconds = int(remaining / rate)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def normalize_title(title: str) -> str:
    """Normalise a title or subject for the title shortcut: NFKC, case-folded, single spaces."""
    return " ".join(unicodedata.normalize("NFKC", title).casefold().split())


def unicode_error(text: str) -> str | None:
    """Why `text` cannot be encoded to UTF-8 (a lone surrogate code point), or None when it can."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return f"not valid Unicode (unpaired surrogate at position {err.start})"
    return None


def _parse_line(line: str, where: str) -> Document:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise CorpusError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
    except (ValueError, RecursionError) as err:  # an integer of over 4,300 digits, nesting too deep
        raise CorpusError(f"{where}: not valid JSON ({err})") from None
    return parse_document(obj, where)


def parse_document(obj: object, where: str) -> Document:
    """A Document from one corpus object {id, title, text | sentences}; CorpusError naming `where` otherwise."""
    if not isinstance(obj, dict):
        raise CorpusError(f"{where}: expected a JSON object with id, title and text")
    doc_id, title = obj.get("id"), obj.get("title")
    if isinstance(doc_id, int) and not isinstance(doc_id, bool) and doc_id.bit_length() <= 64:
        doc_id = str(doc_id)
    if not isinstance(doc_id, str) or doc_id == "":
        raise CorpusError(f"{where}: missing or empty 'id' (a string or a 64-bit integer)")
    if not isinstance(title, str):
        raise CorpusError(f"{where}: missing 'title' (a string)")
    field = "text" if "text" in obj else "sentences"
    text = obj.get(field)
    passages = [text] if isinstance(text, str) else text
    if not isinstance(passages, list) or not all(isinstance(p, str) for p in passages):
        raise CorpusError(f"{where}: 'text' must be a string (or 'sentences' a list of strings)")
    named = [("'id'", doc_id), ("'title'", title)] + [
        (f"'{field}'" if isinstance(text, str) else f"'{field}' item {j + 1}", p) for j, p in enumerate(passages)
    ]
    for name, value in named:
        error = unicode_error(value)
        if error:
            raise CorpusError(f"{where}: {name} is {error}")
    control = next((c for c in CONTROL.findall(doc_id) if c not in "\t\n"), None)
    if control:
        raise CorpusError(f"{where}: 'id' {doc_id!r} holds the control character U+{ord(control):04X}")
    passages = [p.strip() for p in passages if p.strip()]
    if not passages:
        raise CorpusError(f"{where}: document {doc_id!r} has no text")
    date = obj.get("date")
    if date is not None:
        try:
            date = iso_date(date)
        except ValueError as err:
            raise CorpusError(f"{where}: 'date' {err}") from None
    return Document(doc_id, title.strip(), tuple(passages), date, parse_aliases(obj, where))


def parse_aliases(obj: dict, where: str) -> tuple[str, ...]:
    """A corpus object's other names of its subject: its 'aliases' and 'redirects' (lists of strings, either may be
    absent), stripped, without repeats or the empty; CorpusError naming `where` otherwise."""
    found: list[str] = []
    for field in ("aliases", "redirects"):
        names = obj.get(field)
        if names is None:
            continue
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise CorpusError(f"{where}: '{field}' must be a list of strings")
        for n in names:
            error = unicode_error(n)
            if error:
                raise CorpusError(f"{where}: an item of '{field}' is {error}")
        found += [" ".join(n.split()) for n in names if n.strip()]
    return tuple(dict.fromkeys(found))


def iso_date(value: object) -> str:
    """A document's date as the store keeps it: an ISO 8601 date ("2024-05-01") as it is, a date and time
    ("2024-05-01T09:30:00Z") in UTC to the second, so that dates compare as strings. ValueError otherwise."""
    if not isinstance(value, str):
        raise ValueError(f"must be an ISO 8601 date string such as '2024-05-01', not {type(value).__name__}")
    text = value.strip()
    try:
        if len(text) == 10:
            return datetime.date.fromisoformat(text).isoformat()
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{value!r} is not an ISO 8601 date such as '2024-05-01' or '2024-05-01T09:30:00Z'") from None
    if moment.tzinfo is not None:
        moment = _in_utc(moment, value)
    return moment.isoformat(timespec="seconds")


def _in_utc(moment: datetime.datetime, value: str) -> datetime.datetime:
    """`moment` (with an offset) in UTC, without one. ValueError where UTC moves it out of the years 1-9999 that a
    datetime holds ("9999-12-31T23:59:59-01:00"), rather than the OverflowError `astimezone` raises."""
    try:
        return moment.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    except OverflowError:
        raise ValueError(f"{value!r} converted to UTC falls outside the years 1 to 9999") from None


def iter_corpus(path: str | Path) -> Iterator[Document]:
    """Stream the documents of a JSONL corpus ({id, title, text} per line), raising CorpusError on a bad line."""
    return (doc for _, doc in read_jsonl(path))


def read_jsonl(path: str | Path) -> Iterator[tuple[str, Document]]:
    """Each document of a JSONL corpus with where it was read ("path:line"); CorpusError on a bad line."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: no such corpus file")
    seen: set[str] = set()
    count = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                byte = f"byte 0x{raw[err.start]:02x} at column {err.start + 1}"
                raise CorpusError(f"{path}:{number}: not valid UTF-8 ({byte})") from None
            if not line.strip():
                continue
            doc = _parse_line(line, f"{path}:{number}")
            if doc.id in seen:
                raise CorpusError(f"{path}:{number}: duplicate document id {doc.id!r}")
            seen.add(doc.id)
            count += 1
            yield f"{path}:{number}", doc
    if count == 0:
        raise CorpusError(f"{path}: the corpus is empty (expected one JSON document per line)")


def validate_corpus(path: str | Path) -> int:
    """Read the whole corpus once and return its document count, so a bad line fails before anything is written."""
    return sum(1 for _ in iter_corpus(path))


@lru_cache(maxsize=1)
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False)


def _sentencex(passage: str) -> list[str]:
    import sentencex

    return list(sentencex.segment("en", passage))


SPLITTERS = {"pysbd": lambda passage: _segmenter().segment(passage), "sentencex": _sentencex}
SPLITTER = "sentencex"  # new datastores' splitter: the fastest measured, and the closest to pysbd (bench/README.md)
FORMER_SPLITTER = "pysbd"  # what datastores whose manifest names no splitter were split with, and the head's data
SLOW_SPLITTERS = {"pysbd"}  # worth worker processes; sentencex splits faster than a document is sent to a worker


def split_sentences(passage: str, splitter: str = FORMER_SPLITTER) -> list[str]:
    """Split a passage into sentences with one of SPLITTERS (rule-based; both know "U.S." and "3.5"). A datastore
    records the splitter it was built with (older ones: pysbd) and keeps using it."""
    if splitter not in SPLITTERS:
        raise ValueError(f"unknown sentence splitter {splitter!r}: use one of {', '.join(SPLITTERS)}")
    return [s.strip() for s in SPLITTERS[splitter](passage) if s.strip()]


@lru_cache(maxsize=1)
def stopwords() -> frozenset[str]:
    """scikit-learn's English stop words, imported at first use: the command line starts without scikit-learn."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return frozenset(ENGLISH_STOP_WORDS)


def is_content_word(word: str) -> bool:
    """True for a word that may be a target: not a stopword and not punctuation."""
    return any(ch.isalnum() for ch in word) and word.lower() not in stopwords()


def _windows(
    ids: list[int], body: list[int], positions: np.ndarray, lengths: np.ndarray, max_length: int
) -> tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray]:
    """(windows, window of each target, position in it) for a sentence's token ids; `body` lists the positions of
    the sentence's own tokens (contiguous), `positions` and `lengths` its targets' first tokens and token counts.

    One window when the sentence fits in `max_length` tokens; else windows of `max_length` tokens whose slices of
    the body start half a slice apart, the last one ending with the body. A target is read whole in the window
    where it has the most context on its nearer side.
    """
    if len(ids) <= max_length:
        return (np.asarray(ids, np.int64),), np.zeros(len(positions), np.int32), positions.astype(np.int32)
    first, n = body[0], len(body)
    head, tail = ids[:first], ids[first + n :]
    width = max_length - len(head) - len(tail)
    step = max(1, min(width // 2, width - int(lengths.max(initial=1)) + 1))  # every word lies whole in some window
    starts = np.asarray([*range(0, n - width, step), n - width])
    windows = tuple(np.asarray(head + ids[first + a : first + a + width] + tail, np.int64) for a in starts)
    before = positions[:, None] - first - starts  # context before each target in each window's slice
    after = width - before - lengths[:, None]  # and after it
    room = np.where((before >= 0) & (after >= 0), np.minimum(before, after), -width)
    window = np.argmax(room, axis=1)
    return windows, window.astype(np.int32), (positions - starts[window]).astype(np.int32)


def tokenize_sentences(
    tokenizer, sentences: list[str], max_length: int = 128, whole_words: bool = True, names: bool = False
) -> list[Sentence]:
    """Tokenize sentences once each and find their targets: non-stopword, non-punctuation words, of any number of
    tokens (`whole_words`) or of exactly one (a datastore of format 1); with `names`, also each run of 2 to
    MAX_NAME_WORDS capitalised words (`names_of`), after the words.

    A sentence of more than `max_length` tokens is read in overlapping windows (Sentence): no word is dropped.
    """
    if max_length <= tokenizer.num_special_tokens_to_add():
        raise ValueError(f"max_length {max_length} leaves no room for a sentence's tokens")
    if not sentences:
        return []
    enc = tokenizer(sentences, return_offsets_mapping=True, add_special_tokens=True, verbose=False)
    special = set(tokenizer.all_special_ids)
    out = []
    for i, text in enumerate(sentences):
        ids, offsets = enc["input_ids"][i], enc["offset_mapping"][i]
        words: dict[int, list[int]] = {}  # each word's token positions
        for pos, w in enumerate(enc.word_ids(i)):
            if w is not None:
                words.setdefault(w, []).append(pos)
        positions, lengths, spans = [], [], []
        for tokens in words.values():
            start, end = offsets[tokens[0]][0], offsets[tokens[-1]][1]
            start += len(text[start:end]) - len(text[start:end].lstrip())  # a byte-level BPE's offsets hold the space
            allowed = (whole_words or len(tokens) == 1) and tokens[-1] - tokens[0] + 1 == len(tokens)  # contiguous
            if allowed and is_content_word(text[start:end]) and not special.intersection(ids[p] for p in tokens):
                positions.append(tokens[0])
                lengths.append(len(tokens))
                spans.append((start, end))
        if names:
            for first, last in names_of(text, positions, lengths, spans):
                positions.append(positions[first])
                lengths.append(positions[last] + lengths[last] - positions[first])
                spans.append((spans[first][0], spans[last][1]))
        body = [pos for pos, seq in enumerate(enc.sequence_ids(i)) if seq is not None]
        lengths_ = np.asarray(lengths, np.int32)
        windows, window, in_window = _windows(ids, body, np.asarray(positions, np.int64), lengths_, max_length)
        spans_ = np.asarray(spans, dtype=np.int32).reshape(-1, 2)
        out.append(Sentence(text, windows, window, in_window, spans_, lengths_))
    return out


MAX_NAME_WORDS = 4  # longer runs of capitalised words are mostly titles and headings, not one answer


def names_of(text: str, positions: list[int], lengths: list[int], spans: list) -> list[tuple[int, int]]:
    """Multi-word names among a sentence's word targets (in order): runs of 2 to MAX_NAME_WORDS capitalised words,
    each the next token after the one before and one space apart ("Port Elsmere", "Ada Lovelace"); (first, last)
    target index of each. A stopword between (of, the) ends a run: it is no target."""
    out, run = [], []
    for i, (start, _) in enumerate(spans):
        capital = text[start].isupper()
        follows = bool(run) and positions[run[-1]] + lengths[run[-1]] == positions[i]
        if capital and follows and text[spans[run[-1]][1] : start] == " " and len(run) < MAX_NAME_WORDS:
            run.append(i)
            continue
        if len(run) > 1:
            out.append((run[0], run[-1]))
        run = [i] if capital else []
    if len(run) > 1:
        out.append((run[0], run[-1]))
    return out


def question_error(text: str) -> str | None:
    """Return why `text` is not a usable cloze question (not valid Unicode, not exactly one mask), or None."""
    error = unicode_error(text)
    return f"the question is {error}" if error else mask_count_error(text)


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


# Evidence texts: what the sentence weights (model/sentences.py) read of an entry, and what a datastore stores the
# vectors of (store/evidence.py). Pure text, so that both layers compute the same texts.
PLACEHOLDER = "something"  # the unknown word in a question's and a clause's text
TEXT_CACHE = 50_000  # texts whose names-out form is kept (a question's texts recur for each neighbour)


@lru_cache(maxsize=4096)
def _names(title: str) -> re.Pattern[str] | None:
    """One pattern for the title whole (tried first) and each of its words, with a possessive 's; None if none."""
    names = sorted({n for n in (title, *title.split()) if n.strip()}, key=len, reverse=True)
    alternatives = "|".join(map(re.escape, names))
    return re.compile(rf"(?<!\w)(?:{alternatives})(?:'s)?(?!\w)", re.IGNORECASE) if names else None


@lru_cache(maxsize=TEXT_CACHE)
def holds_word(text: str, word: str) -> bool:
    """Whether `text` holds `word` where no word character (`\\w`: alphanumeric or "_") adjoins it on either side: what
    `re.search(rf"(?<!\\w){re.escape(word)}(?!\\w)", text)` finds, without compiling a pattern for each word (a
    question meets hundreds; Python's pattern cache holds 512)."""
    start = text.find(word)
    while start >= 0:
        end = start + len(word)
        if not (start and _word_char(text[start - 1])) and not (end < len(text) and _word_char(text[end])):
            return True
        start = text.find(word, start + 1)
    return False


def _word_char(c: str) -> bool:
    """Whether `re`'s `\\w` matches the character `c` (a str pattern: Unicode alphanumeric or underscore)."""
    return c.isalnum() or c == "_"


def without_names(text: str, title: str) -> str:
    """`text` without the words of a document's `title` (and their possessive 's), the mask and extra spaces: what
    a sentence or a question says of the subject rather than who the subject is. Cached: a question's texts recur
    for each of its neighbours, a sentence for each of its words."""
    text, names = text.replace(MASK, " "), _names(title)
    return " ".join((names.sub(" ", text) if names else text).split())


def clause(sentence: str, span: tuple[int, int], title: str) -> str:
    """The words of `sentence` before the target at character `span`, back to the previous name or number (a word
    that starts with a capital letter or a digit, not the sentence's first word nor a word of `title`), then the
    placeholder: the part of the sentence that says what the target is."""
    names = {w.lower() for w in re.findall(r"\w+", title)}
    cut = 0
    for i, word in enumerate(re.finditer(r"\w+", sentence[: span[0]])):
        text = word.group()
        if i and (text[0].isupper() or text[0].isdigit()) and text.lower() not in names:
            cut = word.end()
    return f"{sentence[cut : span[0]]}{PLACEHOLDER}"


def evidence_texts(sentence: str, span: tuple[int, int], title: str) -> tuple[str, str, str]:
    """An entry's evidence texts: the target's word, the sentence and the target's clause (`clause`), the names of
    the entry's document (`title`) taken out."""
    return tuple(without_names(x, title) for x in (sentence[slice(*span)], sentence, clause(sentence, span, title)))
