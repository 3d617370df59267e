"""The sentence splitter is a property of a datastore: new ones record theirs, older ones keep pysbd."""

from __future__ import annotations

import json

import pytest

from bertknn import BertKNN
from bertknn.store.datastore import Datastore
from bertknn.text import SPLITTER, split_sentences

from .conftest import writable

TONY = (
    "Tony was born, June 25, 1975, in San Diego, CA. He's the eldest of 5 children and moved to Hillsboro, Texas "
    "after high school."
)  # from the evidence corpus: pysbd ends a sentence after "CA.", sentencex does not


def test_the_splitters_differ_on_this_text_and_unknown_ones_are_refused():
    assert split_sentences(TONY, "pysbd") == [
        "Tony was born, June 25, 1975, in San Diego, CA.",
        "He's the eldest of 5 children and moved to Hillsboro, Texas after high school.",
    ]
    assert split_sentences(TONY, "sentencex") == [TONY]
    with pytest.raises(ValueError, match="unknown sentence splitter 'nltk': use one of pysbd, sentencex"):
        split_sentences(TONY, "nltk")


def test_a_store_splits_its_documents_with_its_own_splitter(small_corpus, encoder, tmp_path):
    knn = BertKNN.build(small_corpus, tmp_path / "new", encoder)
    assert SPLITTER == "sentencex" and knn.store.manifest.splitter == "sentencex" == knn.store.manifest["splitter"]
    doc = {"id": "t", "title": "Tony", "text": TONY}
    knn.add_documents([doc])
    assert _last_document_sentences(knn.store) == [TONY]  # one sentence: sentencex
    old = tmp_path / "old"  # a datastore from before the splitter was recorded
    BertKNN.build(small_corpus, old, encoder).store.db.close()
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["splitter"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    store = Datastore(old, check=False)
    assert store.manifest.splitter == "pysbd"
    writable(encoder, store).add_documents([doc])
    assert _last_document_sentences(store) == split_sentences(TONY, "pysbd")


def _last_document_sentences(store: Datastore) -> list[str]:
    return [text for _, _, text in store.documents.sentences([store.n_documents - 1])]
