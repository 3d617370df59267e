"""The lexicon of a datastore: its words of several tokens, numbered from the manifest's `words_from` on (below it,
a value is a vocabulary id: a word of one token), in the `words` table of store.sqlite. Format 1 stores hold no such
words. The query path reads a word's tokens here (`query/words.py`); a writer numbers new words
(`DatastoreWriter.word_values`)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import TYPE_CHECKING

from bertknn.store.manifest import DatastoreError
from bertknn.store.schema import SQLITE

if TYPE_CHECKING:
    from bertknn.store.protocol import OneStore


class Lexicon:
    """The words of several tokens of one datastore (`Datastore.lexicon`), read through its connection of the
    moment."""

    def __init__(self, store: OneStore) -> None:
        self.store = store

    @property
    def whole_words(self) -> bool:
        """Whether this store's targets are whole words (format 2) rather than words of one token (format 1)."""
        return self.store.manifest["version"] >= 2

    @property
    def names(self) -> bool:
        """Whether multi-word names are targets too (besides their words)."""
        return bool(self.store.manifest.get("names"))

    def words(self, values: Iterable[int] | None) -> dict[int, tuple[str, str]]:
        """(tokens' ids as text, word) of the given lexicon numbers (values of words of several tokens; None: all)."""
        if values is None:
            return self.rows()
        wanted = sorted({int(v) for v in values})
        if not wanted:
            return {}
        rows = self.rows("value", wanted)
        missing = [v for v in wanted if v not in rows]
        if missing:
            raise DatastoreError(
                f"{self.store.path / SQLITE} holds no word for values {missing[:5]}: it is damaged; `bertknn verify`"
            )
        return rows

    def rows(self, column: str | None = None, keys: list | None = None) -> dict[int, tuple[str, str]]:
        """value -> (pieces, word) of the `words` table: the rows whose `column` ("value" or "pieces") is one of
        `keys`, or all."""
        query, args = "SELECT value, pieces, word FROM words", ()
        if column is not None:
            query, args = f"{query} WHERE {column} IN (SELECT value FROM json_each(?))", (json.dumps(keys),)
        return {value: (pieces, word) for value, pieces, word in self._select(query, args)}

    def last(self) -> int | None:
        """The highest number given to a word, None before the first."""
        rows = self._select("SELECT max(value) FROM words")
        return rows[0][0] if rows else None

    def _select(self, query: str, args: tuple = ()) -> list[tuple]:
        """The rows of a query of the `words` table; none in a store without it (format 1, or no long word yet)."""
        with self.store.sqlite_errors():
            try:
                return self.store.db.execute(query, args).fetchall()
            except sqlite3.OperationalError as err:
                if "no such table" in str(err):
                    return []
                raise
