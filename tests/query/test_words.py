"""Whole words as answers: a word of several wordpieces is keyed by its one-mask context, scored by the LM from the
question's one pass, added and removed through the CLI and the service, and found right by other tokenizer families;
a datastore of format 1 (words of one wordpiece) opens and answers as it did."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from bertknn import BertKNN
from bertknn.cli import app
from bertknn.model.encoder import Encoder
from bertknn.query.settings import LAM, WORD_BONUS
from bertknn.query.words import Words, scored
from bertknn.serving.service import create_app
from bertknn.store.datastore import DatastoreError
from bertknn.text import tokenize_sentences

from ..conftest import write_corpus
from ..tolerances import DISTANCE_ATOL, DISTANCE_RTOL, FLOAT64_RTOL, MODEL_ATOL, MODEL_RTOL, assert_ranking_close

DATA = Path(__file__).parents[1] / "data"
EDDA = {"id": "x1", "title": "Edda Kallaste", "text": "Edda Kallaste was born in Rakvere. She plays the theorbo."}
ASK = "Edda Kallaste was born in [MASK] ."
RAW = {"confidence_temperature": 1.0, "lm_floor": 0.0}  # the probabilities as combined, not calibrated
runner = CliRunner()


@torch.inference_mode()
def _state(encoder: Encoder, ids: list[int], position: int) -> np.ndarray:
    """The layer-L state at `position` of one unpadded input, straight from the HF model."""
    out = encoder.base(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[encoder.layer][0, position].numpy()


def _entry_of(knn: BertKNN, word: str) -> int:
    """The entry whose evidence span is `word`."""
    spans = knn.store.documents.provenance(list(range(knn.store.size)))
    return next(e.entry for e in spans if e.sentence[e.span[0] : e.span[1]] == word)


def test_a_word_of_several_wordpieces_is_keyed_by_its_one_mask_context(tmp_path, encoder, tokenizer):
    knn = BertKNN.build(write_corpus(tmp_path / "c.jsonl", [EDDA]), tmp_path / "s", encoder)
    ids = tokenizer("Edda Kallaste was born in Rakvere.")["input_ids"]
    pieces = tokenizer("Rakvere", add_special_tokens=False)["input_ids"]
    assert len(pieces) == 3
    at = next(i for i in range(len(ids)) if ids[i : i + 3] == pieces)
    hand = _state(encoder, [*ids[:at], tokenizer.mask_token_id, *ids[at + 3 :]], at)  # one mask for the word
    entry = _entry_of(knn, "Rakvere")
    np.testing.assert_allclose(np.asarray(knn.store.keys[entry], np.float32), hand, rtol=2e-3, atol=2e-3)
    value = int(knn.store.values[entry])
    assert value >= encoder.vocab_size
    assert knn.store.lexicon.words([value]) == {value: (" ".join(map(str, pieces)), "rakvere")}
    born = _entry_of(knn, "born")  # a word of one wordpiece: today's key, its vocabulary id as value
    where = ids.index(tokenizer.convert_tokens_to_ids("born"))
    hand = _state(encoder, [*ids[:where], tokenizer.mask_token_id, *ids[where + 1 :]], where)
    np.testing.assert_allclose(np.asarray(knn.store.keys[born], np.float32), hand, rtol=2e-3, atol=2e-3)
    assert int(knn.store.values[born]) == tokenizer.convert_tokens_to_ids("born")


def test_words_of_one_wordpiece_keep_their_keys_and_long_sentences_hold_whole_words(encoder, tokenizer):
    text = "Edda Kallaste was born in Rakvere and plays the theorbo in Tallinn."
    whole, single = (tokenize_sentences(tokenizer, [text], whole_words=w)[0] for w in (True, False))
    assert set(single.target_pieces()) < set(whole.target_pieces())
    keys_whole, keys_single = encoder.embed([whole]), encoder.embed([single])
    for j, pieces in enumerate(single.target_pieces()):
        same = keys_whole[whole.target_pieces().index(pieces)]  # read in other batches: the model's tolerance
        np.testing.assert_allclose(keys_single[j], same, rtol=MODEL_RTOL, atol=MODEL_ATOL)
    words = [text[a:b] for a, b in whole.spans]
    assert words == ["Edda", "Kallaste", "born", "Rakvere", "plays", "theorbo", "Tallinn"]
    long = tokenize_sentences(tokenizer, [text * 6], max_length=24)[0]  # overlapping windows: no word is cut
    assert [(text * 6)[a:b] for a, b in long.spans] == words * 6
    for w, p, n in zip(long.window, long.positions, long.lengths):
        assert p + n < len(long.windows[w])  # the whole word lies in its window, before [SEP]


@torch.inference_mode()
def test_the_lm_score_of_a_word_is_its_first_piece_s_probability_at_the_question_s_one_mask(encoder, tokenizer):
    ids, mask = encoder.question_ids(ASK)
    texts = ("rakvere", "viljandi", "theorbo")
    pieces = tuple(tuple(tokenizer(w, add_special_tokens=False)["input_ids"]) for w in texts)
    assert all(len(p) > 1 for p in pieces) and len({p[0] for p in pieces}) == 3
    words = Words(encoder.vocab_size, encoder.vocab_size + np.arange(3), pieces, texts, np.zeros(3))
    probs, _ = encoder.query_ids([(ids, mask), (ids, mask)])
    got = scored([words, words], [[0, 2], [1]], probs)
    logits = encoder.model(input_ids=torch.tensor([ids])).logits  # the question alone, straight from the HF model
    p = torch.softmax(logits[0, mask].double(), -1).numpy()
    # float32 logits batched against one by one: the model's tolerance; the words not chosen stay unscored (exactly 0)
    np.testing.assert_allclose(got[0].scores, [p[pieces[0][0]], 0.0, p[pieces[2][0]]], rtol=MODEL_RTOL)
    np.testing.assert_allclose(got[1].scores, [0.0, p[pieces[1][0]], 0.0], rtol=MODEL_RTOL)
    assert words.scores.tolist() == [0.0, 0.0, 0.0]  # scored returns new words


def test_a_question_answered_with_words_of_several_tokens_takes_one_model_pass(tmp_path, encoder, monkeypatch):
    knn = BertKNN.build(write_corpus(tmp_path / "c.jsonl", [EDDA]), tmp_path / "s", encoder)
    passes, run = [], Encoder._run

    def counted(self, forward, *args, **kwargs):
        passes.append(forward.__name__)
        return run(self, forward, *args, **kwargs)

    monkeypatch.setattr(Encoder, "_run", counted)
    p = knn.predict(ASK, "Edda Kallaste", top_k=3)
    several = p.p_bert[encoder.vocab_size :]  # the LM's distribution over the words: scored words of several tokens
    assert (several > 0).any()
    assert passes.count("_mask_outputs") == 1  # the question's pass, no other


def _top(prediction: dict) -> tuple[str, str]:
    """The best BERT-kNN word and the sentence of its first evidence."""
    word = prediction["bert_knn"][0]["token"]
    return word, prediction["evidence"][word][0]["sentence"]


def test_an_invented_town_added_through_the_cli_is_the_answer_and_gone_after_remove(tmp_path, built):
    store = str(built.store.path)
    more = write_corpus(tmp_path / "more.jsonl", [EDDA])
    ask = ["ask", store, ASK, "--subject", "Edda Kallaste", "--json", "--backend", "torch", "--threads", "1"]
    before = runner.invoke(app, ask)
    assert before.exit_code == 0, before.output
    assert "rakvere" not in before.output
    added = runner.invoke(app, ["add", store, str(more), "--threads", "1"])
    assert added.exit_code == 0, added.output
    answer = json.loads(runner.invoke(app, ask).output)
    assert _top(answer) == ("rakvere", "Edda Kallaste was born in Rakvere.")
    fill = answer["fill_mask"]["bert_knn"][0]
    assert fill["token_str"] == "rakvere" and len(fill["token"]) == 3
    assert fill["sequence"] == "edda kallaste was born in rakvere."
    evidence = answer["evidence"]["rakvere"][0]
    assert evidence["sentence"][slice(*evidence["span"])] == "Rakvere"
    assert runner.invoke(app, ["remove", store, "--doc", "x1"]).exit_code == 0
    assert "rakvere" not in runner.invoke(app, ask).output


def test_an_invented_town_added_through_the_service_is_the_answer_and_gone_after_remove(built):
    question = {"text": ASK, "subject": "Edda Kallaste", "top_k": 3}
    with TestClient(create_app(built, writable=True), base_url="http://localhost") as client:
        assert client.post("/documents", json=EDDA).status_code == 201
        answer = client.post("/predict", json=question).json()
        assert _top(answer) == ("rakvere", "Edda Kallaste was born in Rakvere.")
        top = answer["bert_knn"][0]
        assert top["id"] >= built.encoder.vocab_size and len(top["pieces"]) == 3
        assert client.delete("/documents/x1").status_code == 200
        answer = client.post("/predict", json=question).json()
        assert "rakvere" not in json.dumps(answer)


def test_a_datastore_of_format_1_opens_and_answers_as_it_did(tmp_path, tiny_model_dir):
    """tests/data/format1 was built by bertknn before whole words (format 1) with the tiny BERT of conftest, and
    format1_answers.json holds what it answered then, before TF-IDF's documents had to name the question's entity
    (tests/index/test_names.py) and before the subject's own name stopped voting: both are lifted here
    (entity_filter=False), and the filter's one change to these answers checked first."""
    store = shutil.copytree(DATA / "format1", tmp_path / "format1")
    recorded = json.loads((DATA / "format1_answers.json").read_text(encoding="utf-8"))
    knn = BertKNN.load(store, str(tiny_model_dir))
    assert knn.predict("Dante was born in [MASK] .").documents == ["Dante Alighieri"]  # not Ilsa Varnhold's as well
    assert knn.store.manifest["version"] == 1 and not knn.store.lexicon.whole_words
    for (question, subject), expected in zip(recorded["questions"], recorded["answers"]):
        got = knn.predict(question, subject=subject, top_k=5, entity_filter=False, **RAW).to_dict()  # as then
        assert got["documents"] == expected["documents"]
        for method in ("bert", "knn", "bert_knn"):  # recorded on another CPU: floats within the model's tolerance
            ranked = [((t["token"], t["id"]), t["probability"]) for t in got[method]]
            assert_ranking_close(ranked, [((t["token"], t["id"]), t["probability"]) for t in expected[method]])
        evidence = json.loads(json.dumps(got["evidence"]))
        assert all(n.pop("count") == 1 for ns in evidence.values() for n in ns)  # a field added since: not pruned
        assert all(n.pop("date") is None for ns in evidence.values() for n in ns)  # and one the store predates
        assert got["superseded"] == []  # one document per subject
        assert evidence.keys() == expected["evidence"].keys()
        for word, neighbours in evidence.items():
            want = expected["evidence"][word]
            exact = [{k: v for k, v in n.items() if k not in ("distance", "weight")} for n in neighbours]
            assert exact == [{k: v for k, v in n.items() if k not in ("distance", "weight")} for n in want]
            np.testing.assert_allclose(  # float32 keys: a squared distance near 0 needs the absolute term
                [n["distance"] for n in neighbours],
                [n["distance"] for n in want],
                rtol=DISTANCE_RTOL,
                atol=DISTANCE_ATOL,
            )
            weights = [n["weight"] for n in neighbours]  # a softmax of those distances over 6
            np.testing.assert_allclose(weights, [n["weight"] for n in want], rtol=MODEL_RTOL, atol=DISTANCE_ATOL)
    knn.add_documents([EDDA])  # documents added to a format 1 store keep its rule: words of one wordpiece
    values = np.asarray(knn.store.values[: knn.store.size])
    assert values.max() < knn.encoder.vocab_size and knn.store.lexicon.words(None) == {}


def _tokenizer(texts: list[str], special: list[str], mask: str, single: str):
    """A byte-level BPE tokenizer trained on `texts` with a small vocabulary (most words are several tokens), its
    special tokens, a mask token that takes the space before it (as RoBERTa's and ModernBERT's do) and `single`, the
    template of one sequence."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=special, initial_alphabet=alphabet)
    bpe.train_from_iterator(texts, trainer)
    bpe.add_special_tokens([AddedToken(mask, lstrip=True, special=True)])
    cls, sep = single.split()[0], single.split()[-1]
    bpe.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[(t, bpe.token_to_id(t)) for t in (cls, sep)]
    )
    names = dict(zip(("unk_token", "cls_token", "sep_token", "pad_token"), special))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, mask_token=mask, model_max_length=128, **names)


def _roberta(path: Path, texts: list[str]) -> Path:
    """A tiny random RoBERTa-style masked LM: byte-level BPE, <s> ... </s>, `<mask>`."""
    from transformers import RobertaConfig, RobertaForMaskedLM

    tok = _tokenizer(texts, ["<unk>", "<s>", "</s>", "<pad>"], "<mask>", "<s> $A </s>")
    config = RobertaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=130,
        type_vocab_size=1,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
    )
    torch.manual_seed(0)
    RobertaForMaskedLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _modernbert(path: Path, texts: list[str]) -> Path:
    """A tiny random ModernBERT-style masked LM: byte-level BPE, [CLS] ... [SEP], [MASK]."""
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    tok = _tokenizer(texts, ["[UNK]", "[CLS]", "[SEP]", "[PAD]"], "[MASK]", "[CLS] $A [SEP]")
    config = ModernBertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        max_position_embeddings=128,
        pad_token_id=tok.pad_token_id,
        cls_token_id=tok.cls_token_id,
        sep_token_id=tok.sep_token_id,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
        initializer_range=0.5,  # ModernBERT's default (0.02) leaves a random model's states alike whatever the input
    )
    torch.manual_seed(0)
    ModernBertForMaskedLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("family", [_roberta, _modernbert], ids=["roberta", "modernbert"])
def test_other_tokenizer_families_answer_whole_words_end_to_end(tmp_path, small_corpus, family):
    from ..conftest import SMALL_DOCS

    texts = [d["text"] if isinstance(d["text"], str) else " ".join(d["text"]) for d in [*SMALL_DOCS, EDDA]]
    model = family(tmp_path / "model", texts)
    knn = BertKNN.build(small_corpus, tmp_path / "store", str(model))
    pieces = knn.encoder.tokenizer(" Rakvere", add_special_tokens=False)["input_ids"]
    assert len(pieces) > 1  # the town is a word of several tokens for this tokenizer
    sentence = tokenize_sentences(knn.encoder.tokenizer, ["Ilsa Varnhold was born in Lisbon."])[0]
    assert [sentence.text[a:b] for a, b in sentence.spans] == ["Ilsa", "Varnhold", "born", "Lisbon"]
    knn.add_documents([EDDA])
    found = knn.predict(ASK, subject="Edda Kallaste", top_k=3)
    top = found.bert_knn[0]
    assert top.token == "Rakvere" and top.pieces == tuple(pieces)
    evidence = found.evidence["Rakvere"][0]
    assert evidence.sentence[slice(*evidence.span)] == "Rakvere"
    assert found.fill_mask(knn.encoder.tokenizer)[0]["sequence"].endswith("was born in Rakvere .")
    knn.remove_document("x1")
    assert "Rakvere" not in [t.token for t in knn.predict(ASK, subject="Edda Kallaste").knn]


def test_verify_names_a_value_that_is_no_word_of_the_store(tmp_path, encoder):
    from bertknn.store.verify import verify

    knn = BertKNN.build(write_corpus(tmp_path / "c.jsonl", [EDDA]), tmp_path / "s", encoder)
    assert verify(knn.store.path).problems == []
    entry = _entry_of(knn, "Rakvere")
    values = np.memmap(knn.store.path / "values.i32", np.int32, "r+")
    values[entry] = max(knn.store.lexicon.words(None)) + 7  # past the lexicon: a word the store never held
    values.flush()
    problems = verify(knn.store.path).problems
    assert f"values.i32: entries [{entry}] hold values that are no word of the store" in "\n".join(problems)
    with pytest.raises(DatastoreError, match=r"holds no word for values \[\d+\]: it is damaged"):
        knn.store.lexicon.words([int(values[entry])])


def test_multi_word_names_are_one_answer_besides_their_words(tmp_path, encoder):
    text = "Maris Oldenvaart was born in Port Elsmere. She blows glass."
    doc = {"id": "m1", "title": "Maris Oldenvaart", "text": text}
    corpus = write_corpus(tmp_path / "c.jsonl", [doc])
    knn = BertKNN.build(corpus, tmp_path / "s", encoder, names=True)
    words = {text for _, text in knn.store.lexicon.words(None).values()}
    assert {"maris oldenvaart", "port elsmere", "elsmere", "oldenvaart"} <= words
    found = knn.predict("Maris Oldenvaart was born in [MASK] .", subject="Maris Oldenvaart", top_k=3)
    assert found.neighbours.distances[0] < 1e-3  # the name's context is the question's (the tiny random model
    assert {t.token for t in found.knn[:2]} == {"port elsmere", "port"}  # reads "born in [MASK] Elsmere" alike)
    evidence = found.evidence["port elsmere"][0]
    assert evidence.sentence[slice(*evidence.span)] == "Port Elsmere"
    plain = BertKNN.build(corpus, tmp_path / "plain", encoder)
    assert knn.store.size == plain.store.size + 2  # the two names, besides their four words
    with pytest.raises(DatastoreError, match="holds whole words and names"):
        BertKNN.build(corpus, tmp_path / "s", encoder)  # a resume must keep the targets
    with pytest.raises(DatastoreError, match="drop --pack or --names"):
        BertKNN.build(corpus, tmp_path / "packed", encoder, pack=2, names=True)


def test_the_lm_scores_the_words_of_several_wordpieces_among_the_knns_best(built):
    question, vocab = "Ilsa Varnhold was born in [MASK] .", built.encoder.vocab_size
    every = built.predict(question, lm_words=0, link=False, **RAW)  # TF-IDF's documents: more words to choose from
    held = np.flatnonzero(every.p_knn)
    order = held[np.lexsort((held, -every.p_knn[held]))]
    m = int(np.flatnonzero(order >= vocab)[0]) + 1  # the kNN's best words down to its first long one
    few = built.predict(question, lm_words=m, link=False, **RAW)
    np.testing.assert_array_equal(few.p_knn, every.p_knn)  # the same neighbours and vote
    best = order[:m]
    chosen, left = best[best >= vocab], np.setdiff1d(held[held >= vocab], best)
    assert len(chosen) and len(left)  # the case in point: some long words scored, some not
    assert (every.p_bert[held[held >= vocab]] > 0).all() and not few.p_bert[left].any()
    scored = np.concatenate([np.arange(vocab), chosen])  # the same LM scores, normalised over fewer words
    # the long words are read by the LM in batches of other shapes in the two calls: the model's tolerance
    ratios = [p.p_bert[scored] / p.p_bert[0] for p in (few, every)]
    np.testing.assert_allclose(*ratios, rtol=MODEL_RTOL)
    assert not few.p[left].any() and few.p[chosen].all()  # left out of the log-linear mixture
    kept = np.setdiff1d(held, left)
    texts = {vocab + i: text for i, text in enumerate(built.words(few.neighbours).texts)}
    asked = [i >= vocab and texts[i] in question.lower().split() for i in kept]
    # the mixture's factor for words of several wordpieces that the question does not contain
    bonus = np.where((kept >= vocab) & ~np.array(asked), WORD_BONUS, 1.0)
    expected = few.p_knn[kept] ** LAM * few.p_bert[kept] ** (1 - LAM) * bonus
    np.testing.assert_allclose(few.p[kept], expected / expected.sum(), rtol=FLOAT64_RTOL)
    plain = built.predict(question, lm_words=m, word_bonus=1.0, link=False, **RAW)
    expected = plain.p_knn[kept] ** LAM * plain.p_bert[kept] ** (1 - LAM)
    np.testing.assert_allclose(plain.p[kept], expected / expected.sum(), rtol=FLOAT64_RTOL)


def test_the_bonus_goes_to_words_of_several_wordpieces_that_the_question_does_not_contain():
    words = Words(3, np.array([5, 6, 7]), ((1, 2), (1, 3), (2, 3)), ("varnhold", "rakvere", "port elsmere"))
    assert words.prior(1.0, "anything") is None and Words(3).prior(10.0) is None
    np.testing.assert_array_equal(words.prior(10.0, "Ilsa Varnhold was born in [MASK] ."), [1, 1, 1, 1, 10, 10])
    np.testing.assert_array_equal(words.prior(10.0, "Varnholden went to Port Elsmere."), [1, 1, 1, 10, 10, 1])
