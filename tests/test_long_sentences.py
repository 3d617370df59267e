"""Sentences longer than the model's input: read in overlapping windows, every target word stored once."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
import torch

from bertknn.query.pipeline import BertKNN
from bertknn.text import split_sentences, tokenize_sentences
from tests.conftest import write_corpus
from tests.test_text import reference_targets, words_of

STORY = (
    "the old harbour town on the northern coast had wooden houses painted red and green , a market square with "
    "a stone fountain , narrow streets that climbed towards the castle on the hill , and a church whose tower "
    "could be seen from every ship that sailed into the bay"
)
LONG = " ".join((STORY.split() * 5)[:146]) + " , and the composer was born in Tallinn ."


def test_the_long_sentence_is_one_sentence_of_more_than_128_tokens(tokenizer):
    assert split_sentences(LONG) == [LONG]
    assert len(tokenizer(LONG, verbose=False)["input_ids"]) > 128


def _starts(tokenizer, sent) -> list[int]:
    """Where each window's slice begins in the sentence's tokens (checking that it is a slice of them)."""
    body = tokenizer(sent.text, verbose=False)["input_ids"][1:-1]
    starts = []
    for ids in sent.windows:
        part = ids[1:-1].tolist()
        start = next(a for a in range(len(body)) if body[a : a + len(part)] == part)
        starts.append(start)
    return starts


def test_every_word_of_a_long_sentence_is_a_target_once_from_its_most_central_window(tokenizer):
    (sent,) = tokenize_sentences(tokenizer, [LONG], max_length=128)
    tokens = words_of(tokenizer, sent)
    assert tokens == reference_targets(tokenizer, LONG)  # every content word, once, in order
    assert tokens[-2:] == ["born", "tallinn"]
    assert len(sent.windows) > 1 and len(sent.window) == len(sent.positions) == len(sent.spans)
    for ids in sent.windows:
        assert len(ids) <= 128 and ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    for (a, b), pieces in zip(sent.spans, sent.target_pieces()):  # spans stay spans of the whole sentence's text
        assert tokenizer.tokenize(LONG[a:b]) == tokenizer.convert_ids_to_tokens(list(pieces))
    starts = _starts(tokenizer, sent)
    width = len(sent.windows[0]) - 2
    assert starts[0] == 0 and starts[-1] + width == len(tokenizer(LONG, verbose=False)["input_ids"]) - 2
    assert all(0 < b - a <= width // 2 for a, b in pairwise(starts))  # windows overlap by half or more
    for w, p, n in zip(sent.window, sent.positions, sent.lengths):
        t = starts[w] + p - 1  # the target's first index in the sentence's tokens
        context = [min(t - s, s + width - t - n) if s <= t and t + n <= s + width else -1 for s in starts]
        assert context[w] == max(context) >= 0  # read whole where it has the most context on its nearer side


@pytest.mark.parametrize(("n_words", "windows"), [(126, 1), (127, 2)])
def test_a_sentence_that_fits_keeps_one_window_of_all_its_tokens(tokenizer, n_words, windows):
    text = " ".join(["city"] * n_words)  # n_words + 2 tokens
    (sent,) = tokenize_sentences(tokenizer, [text], max_length=128)
    assert len(sent.windows) == windows and len(sent.target_pieces()) == n_words
    if windows == 1:
        assert sent.windows[0].tolist() == tokenizer(text)["input_ids"]
        assert sent.positions.tolist() == list(range(1, n_words + 1)) and not sent.window.any()


def test_keys_of_a_long_sentence_are_those_of_each_window_embedded_alone(encoder, tokenizer):
    (sent,) = tokenize_sentences(tokenizer, [LONG], max_length=128)
    keys = encoder.embed([sent])
    for (_, targets), alone in zip(sent.window_targets(), sent.split()):
        np.testing.assert_allclose(keys[targets], encoder.embed([alone]), atol=1e-5)
    last = len(sent.positions) - 1  # "tallinn", by the model itself
    ids = torch.tensor(sent.windows[sent.window[last]]).unsqueeze(0).clone()
    ids[0, sent.positions[last]] = tokenizer.mask_token_id
    with torch.no_grad():
        state = encoder.model(input_ids=ids, output_hidden_states=True).hidden_states[encoder.layer][0]
    np.testing.assert_allclose(keys[last], state[sent.positions[last]].numpy(), atol=1e-5)
    packed = encoder.embed([sent], pack=3)  # packing groups the targets of one window only
    for (_, targets), alone in zip(sent.window_targets(), sent.split()):
        np.testing.assert_allclose(packed[targets], encoder.embed([alone], pack=3), atol=1e-5)


def test_a_fact_at_the_end_of_a_long_sentence_reaches_the_datastore(tmp_path, encoder, tokenizer):
    corpus = write_corpus(tmp_path / "long.jsonl", [{"id": "t", "title": "Harbour town", "text": LONG}])
    knn = BertKNN.build(corpus, tmp_path / "store", encoder)
    values = np.asarray(knn.store.values)
    tallinn = tokenizer.convert_tokens_to_ids("tallinn")
    assert len(values) == len(reference_targets(tokenizer, LONG))
    (entry,) = np.flatnonzero(values == tallinn)
    (evidence,) = knn.store.documents.provenance([int(entry)])
    a, b = evidence.span
    assert evidence.sentence == LONG and LONG[a:b] == "Tallinn"
