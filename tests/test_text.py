"""Text stage: corpus reading and its errors, sentence splitting, target selection."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

from bertknn.text import (
    CorpusError,
    holds_word,
    iter_corpus,
    mask_count_error,
    masked,
    split_sentences,
    tokenize_sentences,
    validate_corpus,
)


def reference_targets(tokenizer, sentence: str, whole_words: bool = True) -> list[str]:
    """Targets by a different route: pre-tokenize into words, keep content words (of one wordpiece, unless
    `whole_words`) that have no unknown piece."""
    normalized = tokenizer.backend_tokenizer.normalizer.normalize_str(sentence)
    words = [w for w, _ in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(normalized)]
    return [
        w
        for w in words
        if (whole_words or len(tokenizer.tokenize(w)) == 1)
        and tokenizer.unk_token not in tokenizer.tokenize(w)
        and w not in ENGLISH_STOP_WORDS
        and any(c.isalnum() for c in w)
    ]


def words_of(tokenizer, sent) -> list[str]:
    """The targets of a tokenized sentence as words (their pieces joined)."""
    return [tokenizer.decode(list(pieces)) for pieces in sent.target_pieces()]


def test_sentence_splitter_keeps_abbreviations_and_decimals():
    text = "He moved to the U.S. in 1990. It cost 3.5 dollars. Dr. Smith agreed."
    assert split_sentences(text) == ["He moved to the U.S. in 1990.", "It cost 3.5 dollars.", "Dr. Smith agreed."]


@pytest.mark.parametrize(
    "sentence",
    [
        "Allan Peiper (born 26 April 1960 in Alexandra, Australia) is a former professional cyclist.",
        "The café in São Paulo opened in 1911; Zürich's embassy-staff disagreed.",
        "Dante wrote the Divine Comedy, an epic poem, in Italian.",
    ],
)
@pytest.mark.parametrize("whole_words", [True, False])
def test_targets_match_a_word_level_reference(tokenizer, sentence, whole_words):
    (sent,) = tokenize_sentences(tokenizer, [sentence], whole_words=whole_words)
    assert words_of(tokenizer, sent) == reference_targets(tokenizer, sentence, whole_words)
    for (a, b), pieces in zip(sent.spans, sent.target_pieces()):  # spans point at the original characters
        assert tokenizer.tokenize(sentence[a:b]) == tokenizer.convert_ids_to_tokens(list(pieces))


def test_targets_are_whole_words_without_stopwords_and_punctuation(tokenizer):
    (sent,) = tokenize_sentences(tokenizer, ["The peiper of Alexandra, the cyclist."])
    assert words_of(tokenizer, sent) == ["peiper", "alexandra", "cyclist"]  # "the"/"of" stopwords, "," "." not
    assert sent.lengths.tolist() == [2, 1, 1]  # pei ##per
    (one,) = tokenize_sentences(tokenizer, ["The peiper of Alexandra, the cyclist."], whole_words=False)
    assert words_of(tokenizer, one) == ["alexandra", "cyclist"]  # format 1: words of one wordpiece


def test_reads_text_and_sentence_lists(small_corpus):
    docs = list(iter_corpus(small_corpus))
    assert [d.id for d in docs] == ["d1", "d2", "d3", "d4", "d5"]
    assert docs[3].passages == ("Paris is the capital of France.", "The U.S. embassy is near the river.")
    assert validate_corpus(small_corpus) == 5


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "the corpus is empty"),
        ('{"id": "a", "title": "A", "text": "x"}\n{"id": "b", "title": "B", "text": "y"\n', ":2: not valid JSON"),
        ('{"id": "a", "title": "A", "text": "   "}\n', ":1: document 'a' has no text"),
        ('{"title": "A", "text": "x"}\n', ":1: missing or empty 'id'"),
        ('{"id": "a", "text": "x"}\n', ":1: missing 'title'"),
        ('{"id": "a", "title": "A", "text": 3}\n', ":1: 'text' must be a string"),
        ("[1, 2]\n", ":1: expected a JSON object"),
        (
            '{"id": "a", "title": "A", "text": "x"}\n{"id": "a", "title": "B", "text": "y"}\n',
            ":2: duplicate document id",
        ),
    ],
)
def test_bad_corpus_lines_are_named(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(CorpusError, match=message.replace("(", r"\(")):
        validate_corpus(path)


def test_mask_count_messages():
    assert mask_count_error("Dante was born in [MASK].") is None
    assert "has no [MASK]" in mask_count_error("Dante was born in Florence.")
    assert "has 2 [MASK] tokens" in mask_count_error("[MASK] was born in [MASK].")


def reference_masked(ids: list[int], starts: dict[int, int], mask_id: int) -> tuple[list[int], list[int]]:
    """`masked` by walking the tokens: a target's first token becomes the mask, its other tokens are dropped."""
    out, where, i = [], [], 0
    while i < len(ids):
        if i in starts:
            where.append(len(out))
            out.append(mask_id)
            i += starts[i]
        else:
            out.append(ids[i])
            i += 1
    return out, where


@pytest.mark.parametrize("targets", [1, 2, 3])
def test_masked_matches_walking_the_tokens(targets: int) -> None:
    rng = np.random.default_rng(targets)
    for _ in range(200):
        ids = rng.integers(5, 1000, int(rng.integers(2 * targets + 2, 30))).astype(np.int32)
        cuts = np.sort(rng.choice(np.arange(1, len(ids)), 2 * targets, replace=False))  # non-overlapping spans
        positions, ends = cuts[0::2], cuts[1::2]
        out, where = masked(ids, positions, ends - positions, 103)
        expected_out, expected_where = reference_masked(ids.tolist(), dict(zip(positions, ends - positions)), 103)
        assert out.tolist() == expected_out and where.tolist() == expected_where
        assert out.dtype == ids.dtype


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="ab _-.é1٣ß", max_size=30), st.text(alphabet="ab _-.é1٣ß", min_size=1, max_size=4))
def test_a_word_held_in_a_question_is_what_the_word_bounded_pattern_finds(text, word):
    # a small alphabet of word characters (letters, a digit, an Arabic-Indic digit, "_") and others, so that words
    # adjoin and repeat often
    assert holds_word(text, word) == bool(re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text))
