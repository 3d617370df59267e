"""One writer per store, opened once; readers as snapshots of one commit until they are reopened (issue 64)."""

from __future__ import annotations

import pytest

from bertknn import BertKNN, DatastoreError
from bertknn.store.datastore import Datastore
from bertknn.store.lock import BusyError
from bertknn.store.writers import open_writer
from tests.conftest import held_elsewhere

NEW = {"id": "n1", "title": "Zorblat Quenmire", "text": "Zorblat Quenmire was born in Tallinn. He sells boats."}
REPLACED = {"id": "d1", "title": "Ilsa Varnhold", "text": "Ilsa Varnhold was born in Oslo. She paints in Rome."}
QUESTIONS = [
    ("Zorblat Quenmire was born in [MASK] .", "Zorblat Quenmire"),  # a document added
    ("Ilsa Varnhold was born in [MASK] .", "Ilsa Varnhold"),  # a document replaced
    ("Dante was born in [MASK] .", "Dante Alighieri"),  # a document removed
    ("Zorblat Quenmire was born in [MASK] .", None),  # the same, the subject found in the text
    ("Ilsa Varnhold was born in [MASK] .", None),
    ("Dante was born in [MASK] .", None),
]


def _answers(knn: BertKNN) -> list[tuple]:
    """What a user reads of each question: the kNN's and the combined ranking, the documents read, the link."""
    asked = knn.predict_batch([q for q, _ in QUESTIONS], [s for _, s in QUESTIONS], top_k=3, evidence=1)
    return [(p.knn, p.bert_knn, p.documents, p.evidence, p.linked) for p in asked]


def test_a_process_opens_one_writer_per_store_and_the_lock_goes_with_its_last_holder(built):
    path = built.store.path
    first = open_writer(path)
    second = open_writer(built.store)  # the same store, by its reader: the writer this process holds
    assert second is first and second.store.writer is first
    with pytest.raises(BusyError, match="one writer at a time"), held_elsewhere(path):
        pass  # another process's writer waits while this one is held
    first.close()
    with pytest.raises(BusyError), held_elsewhere(path):
        pass  # one holder is left
    second.close()
    with held_elsewhere(path):  # the last holder closed it: the lock is free
        pass
    with pytest.raises(DatastoreError, match="is closed"):
        first.remove(["d2"])
    assert built.store.documents.states(["d2"]) == {"d2": "live"}


def test_a_reader_answers_from_its_commit_until_it_is_reopened(built):
    reader = BertKNN(built.encoder, Datastore(built.store.path))  # another reader, writing nothing
    before, counts = (
        _answers(reader),
        (reader.store.size, reader.store.n_documents, reader.store.documents.count_live()),
    )
    built.add_documents([NEW])
    built.add_documents([REPLACED], replace=True)
    built.remove_documents(["d3"])
    assert _answers(built) != before  # the writing object takes its own commits in at once
    assert _answers(reader) == before  # the reader still holds its commit: every answer as it was
    assert (reader.store.size, reader.store.n_documents, reader.store.documents.count_live()) == counts
    assert reader.refresh() and not reader.refresh()  # reopened on the latest commit, then nothing new
    assert _answers(reader) == _answers(built)
    assert reader.store.documents.count_live() == counts[2]  # one added, one replaced (as many), one removed
    reader.close()


def test_a_reader_is_never_written_through(built):
    with pytest.raises(DatastoreError, match="is opened for reading and never writes"):
        built.store.writer.remove(["d2"])
    with open_writer(built.store) as writer:
        assert writer.store is not built.store and writer.store.db is not built.store.db
