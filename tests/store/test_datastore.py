"""Datastore storage: evidence and document ranges read back, corruption reported; `assert_same_store` compares two
stores' keys, values and SQLite tables (the builder's tests, tests/ingest/test_builder.py, use it)."""

from __future__ import annotations

import sqlite3
from itertools import pairwise

import numpy as np
import pytest

from bertknn.ingest import builder
from bertknn.store.datastore import Datastore, DatastoreError

from ..conftest import SMALL_DOCS


def test_evidence_of_many_entries_comes_in_the_order_asked(tmp_path, small_corpus, encoder):
    store = builder.build(small_corpus, tmp_path / "s", encoder)
    entries = [store.size - 1, 0, 7, 0]
    together = store.documents.provenance(entries)
    assert [e.entry for e in together] == entries
    assert together == [store.documents.provenance([e])[0] for e in entries]
    assert together[0].doc_id != together[1].doc_id


def test_documents_own_contiguous_ranges(tmp_path, small_corpus, encoder):
    store = builder.build(small_corpus, tmp_path / "s", encoder)
    ranges = store.documents.ranges(list(range(5)))
    assert ranges[0][0] == 0 and ranges[-1][1] == store.size
    assert all(a[1] == b[0] for a, b in pairwise(ranges))
    for doc, (start, end) in enumerate(ranges):
        titles = {e.title for e in store.documents.provenance(list(range(start, end)))}
        assert titles == {SMALL_DOCS[doc]["title"]}


def _tables(path) -> dict:
    with sqlite3.connect(path / "store.sqlite") as db:
        return {
            t: db.execute(f"SELECT * FROM {t} ORDER BY idx").fetchall() for t in ("documents", "sentences", "entries")
        }


def assert_same_store(a, b) -> None:
    sa, sb = Datastore(a), Datastore(b)
    assert sa.size == sb.size and sa.manifest.complete and sb.manifest.complete
    assert np.array_equal(np.asarray(sa.keys), np.asarray(sb.keys))
    assert np.array_equal(np.asarray(sa.values), np.asarray(sb.values))
    assert _tables(a) == _tables(b)


def test_corrupt_and_truncated_datastores_are_reported(tmp_path, small_corpus, encoder):
    builder.build(small_corpus, tmp_path / "s", encoder)
    keys = tmp_path / "s" / "keys.f16"
    keys.write_bytes(keys.read_bytes()[:-10])
    with pytest.raises(DatastoreError, match=r"keys.f16 is truncated .* rebuild it"):
        Datastore(tmp_path / "s")
    (tmp_path / "s" / "manifest.json").write_text("{not json")
    with pytest.raises(DatastoreError, match="corrupt"):
        Datastore(tmp_path / "s")
    with pytest.raises(DatastoreError, match="not a datastore"):
        Datastore(tmp_path)
