"""What a datastore keeps, as records: a document (`Record`), where a stored entry comes from (`Provenance`), a live
part of an index (`Part`), what an add made of the documents it was given (`Staged`), and the order of an article's
versions (`versions`, `newest_first`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    """A live part of an index (a TF-IDF segment, a FAISS file) as the datastore's commit point lists it: its name
    (relative to the datastore) and the items it covers, first..stop (documents or entries)."""

    name: str
    first: int
    stop: int


@dataclass(frozen=True)
class Staged:
    """What an add made of the documents it was given, by id (`DatastoreWriter.stage`): new ones added, ones that take
    the place of a live document with other text (`replace`), and ones skipped because the same document is live."""

    added: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()


@dataclass(frozen=True)
class Record:
    """A document as the store keeps it: id, title (and its normalised form for the title shortcut), sentences, and
    a digest of its text that tells a second add of the same document from one with other text."""

    id: str
    title: str
    norm_title: str
    sentences: tuple[str, ...]
    digest: str
    date: str | None = None  # the document's date (`text.iso_date`), when its corpus gives one
    aliases: tuple[str, ...] = ()  # other names of its subject (`text.Document.aliases`)


@dataclass(frozen=True)
class Provenance:
    """Where a stored entry comes from: its document, its sentence and the target's character span there."""

    entry: int
    doc_id: str
    title: str
    sentence: str
    span: tuple[int, int]
    count: int = 1  # the contexts this entry stands for: more than 1 where pruning merged near-duplicates into it
    date: str | None = None  # its document's own date (None where its corpus gave none)


def versions(docs: list[int], dated_titles: list[tuple[str, str | None]]) -> list[list[int]]:
    """`docs` grouped by normalised title (the versions of one article: an article and its updates), each group
    newest first (`newest_first`), the groups in the order of their first document in `docs`."""
    groups: dict[str, list[tuple[int, str | None]]] = {}
    for doc, (title, date) in zip(docs, dated_titles):
        groups.setdefault(title, []).append((doc, date))
    return [[doc for doc, _ in newest_first(group)] for group in groups.values()]


def newest_first(dated: list[tuple[int, str | None]]) -> list[tuple[int, str | None]]:
    """(document, date) pairs newest first: by the date (a document's own, else the newest date registered before it:
    ISO 8601 strings compare as times), then the later registered; those without either (a corpus without dates) by
    the order they were registered, after the dated ones. Only dates and the order of registration count, never the
    clock, so that a rerun writes the store an uninterrupted run wrote."""
    return sorted(dated, key=lambda d: (d[1] is not None, d[1] or "", d[0]), reverse=True)
