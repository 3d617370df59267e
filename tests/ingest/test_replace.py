"""`add --replace` (Lucene's updateDocument): a document whose id is live with other text is replaced in the one
transaction that publishes the new text; a reader sees the old document or the new one, never both or neither
(kill -9 and a full disk at every write: tests/reliability, command "replace")."""

import pytest

from bertknn.store.datastore import DatastoreError
from bertknn.store.records import Staged
from bertknn.store.schema import REPLACING_PREFIX
from bertknn.store.writer import DatastoreWriter

QUESTION, SUBJECT = "Ilsa Varnhold was born in [MASK] .", "Ilsa Varnhold"
MOVED = {"id": "d1", "title": "Ilsa Varnhold", "text": "Ilsa Varnhold was born in Porto. She plays the cello."}


def _live(store, doc_id: str) -> list[tuple]:
    return store.db.execute("SELECT idx, title FROM documents WHERE id = ? AND state = 'live'", (doc_id,)).fetchall()


def test_a_live_id_with_other_text_is_refused_without_replace_and_replaced_with_it(built):
    with pytest.raises(DatastoreError, match=r"already in the datastore: \['d1'\]; .*`bertknn add --replace`"):
        built.add_documents([MOVED])
    assert built.add_documents([MOVED], replace=True) > 0
    assert built.writer.staged == Staged(replaced=("d1",))  # the add says what it did: no caller works it out
    assert _live(built.store, "d1") == [(5, "Ilsa Varnhold")]  # one live d1: the new text, a new document number
    assert [d for d, _ in built.store.documents.find_titles("ilsa varnhold")] == [5]
    (old,) = built.store.db.execute("SELECT state, removed_id FROM documents WHERE idx = 0").fetchall()
    assert old == ("removed", "d1")
    answer = built.predict(QUESTION, subject=SUBJECT, lam=1.0)
    assert answer.bert_knn[0].token == "porto" and "lisbon" not in {t.token for t in answer.bert_knn}
    assert built.add_documents([MOVED], replace=True) == 0  # the same text again: nothing to do
    assert built.writer.staged == Staged(unchanged=("d1",))
    assert _live(built.store, "d1") == [(5, "Ilsa Varnhold")]
    fresh = {"id": "n1", "title": "Someone", "text": "Someone was born in Oslo."}
    assert built.add_documents([fresh], replace=True) > 0 and len(_live(built.store, "n1")) == 1  # a plain add
    assert built.writer.staged == Staged(added=("n1",))
    again = {**MOVED, "text": MOVED["text"] + " She sings."}
    assert built.add_documents([again, fresh, {**fresh, "id": "n2"}], replace=True) > 0
    assert built.writer.staged == Staged(added=("n2",), replaced=("d1",), unchanged=("n1",))


def test_an_interrupted_replace_leaves_the_old_document_and_a_rerun_completes_it(built, monkeypatch):
    store = built.store

    def crash(self, **parts):
        raise KeyboardInterrupt  # stands for a kill between staging and publishing

    with monkeypatch.context() as patch:
        patch.setattr(DatastoreWriter, "publish", crash)
        with pytest.raises(KeyboardInterrupt):
            built.add_documents([MOVED], replace=True)
    assert _live(store, "d1") == [(0, "Ilsa Varnhold")]  # readers still see the old text only
    staged = store.db.execute("SELECT id, state FROM documents WHERE idx = 5").fetchall()
    assert staged == [(REPLACING_PREFIX + "d1", "adding")]
    assert built.predict(QUESTION, subject=SUBJECT, lam=1.0).bert_knn[0].token == "lisbon"
    built.add_documents([MOVED], replace=True)  # the rerun: the staged document is published, not staged again
    assert built.writer.staged == Staged(replaced=("d1",))
    assert _live(store, "d1") == [(5, "Ilsa Varnhold")] and store.n_documents == 6
    assert built.predict(QUESTION, subject=SUBJECT, lam=1.0).bert_knn[0].token == "porto"
