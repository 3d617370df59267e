"""Encoder stage: loading, refusing a headless checkpoint, one pass for logits and states, the truncated trunk."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest
import torch

from bertknn.model.encoder import Encoder, ModelError, QuestionError, length_batches, mask_groups
from bertknn.text import tokenize_sentences

from ..tolerances import MODEL_ATOL, MODEL_RTOL


def test_headless_checkpoint_is_refused(headless_model_dir):
    with pytest.raises(ModelError, match=r"has no trained masked-LM head .*cls.predictions"):
        Encoder.load(str(headless_model_dir))


def test_unknown_model_is_refused(tmp_path):
    with pytest.raises(ModelError, match=r"cannot load model .* neither a local directory"):
        Encoder.load(str(tmp_path / "no-such-model"))


def test_layer_must_exist(tiny_model_dir):
    with pytest.raises(ModelError, match=r"layer 5 does not exist: .* has blocks 1..4"):
        Encoder.load(str(tiny_model_dir), layer=5)


def test_default_layer_is_second_to_last_and_trunk_stops_there(encoder):
    assert encoder.layer == 3
    assert encoder.trunk is not None and len(encoder.trunk.encoder.layer) == 3
    assert len(encoder.base.encoder.layer) == 4  # the model itself is untouched


def test_query_gives_lm_distribution_and_layer_state_in_one_pass(encoder, tokenizer):
    text = "Dante was born in [MASK] ."
    probs, states = encoder.query([text, "The capital of Portugal is [MASK] ."])
    ids = tokenizer(text.replace("[MASK]", tokenizer.mask_token), return_tensors="pt")["input_ids"]
    pos = int((ids[0] == tokenizer.mask_token_id).nonzero())
    with torch.no_grad():
        out = encoder.model(input_ids=ids, output_hidden_states=True)
    np.testing.assert_allclose(probs[0], torch.softmax(out.logits[0, pos], -1).numpy(), atol=1e-6)
    np.testing.assert_allclose(states[0], out.hidden_states[3][0, pos].numpy(), atol=1e-5)
    assert probs.shape == (2, tokenizer.vocab_size) and np.allclose(probs.sum(1), 1.0, atol=1e-5)


@pytest.mark.parametrize("budget", [1, 20, 64, 10_000])
def test_length_batches_sort_by_length_and_fill_the_token_budget(budget):
    lengths = np.random.default_rng(budget).integers(3, 30, 50).tolist()
    batches = list(length_batches(lengths, budget))
    assert sorted(i for b in batches for i in b) == list(range(50))
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat)
    for batch, following in pairwise([*batches, None]):
        padded = len(batch) * max(lengths[i] for i in batch)
        assert padded <= budget or len(batch) == 1
        if following:  # the next item would have broken the budget
            assert (len(batch) + 1) * lengths[following[0]] > budget


def test_query_batches_by_length_and_answers_in_the_order_asked(encoder):
    questions = ["Dante was born in [MASK] .", "[MASK] .", "The capital of the old kingdom of Portugal is [MASK] ."]
    probs, states = encoder.query(questions)  # one batch, padded
    for i, text in enumerate(questions):
        alone_probs, alone_states = encoder.query([text])
        np.testing.assert_allclose(probs[i], alone_probs[0], atol=1e-6)
        np.testing.assert_allclose(states[i], alone_states[0], atol=1e-5)
    tight = encoder.query(questions, token_budget=1)  # one question per batch, shortest first
    np.testing.assert_allclose(tight[0], probs, atol=1e-6)
    np.testing.assert_allclose(tight[1], states, atol=1e-5)


@pytest.mark.parametrize(
    ("text", "message"),
    [("Dante was born in Florence.", "has no \\[MASK\\]"), ("[MASK] was born in [MASK].", "has 2 \\[MASK\\] tokens")],
)
def test_bad_questions(encoder, text, message):
    with pytest.raises(QuestionError, match=message):
        encoder.query([text])


def test_weights_hash_tells_models_apart(encoder, tokenizer):
    other = Encoder(type(encoder.model)(encoder.model.config), tokenizer, "other")
    assert encoder.weights_hash != other.weights_hash
    assert len(encoder.weights_hash) == 64


@pytest.mark.parametrize("n", range(0, 12))
@pytest.mark.parametrize("pack", [1, 2, 3, 4])
def test_mask_groups_cover_every_target_once_never_adjacent(n, pack):
    groups = mask_groups(n, pack)
    assert sorted(j for g in groups for j in g) == list(range(n))
    assert all(1 <= len(g) <= pack for g in groups)
    assert all(b - a >= 2 for g in groups for a, b in pairwise(g))  # another target lies between
    passes = n if pack == 1 else max(math.ceil(n / pack), min(n, 2))  # the fewest that keep targets apart
    assert len(groups) == passes


def test_packed_keys_are_the_states_of_their_jointly_masked_sentence(encoder, tokenizer):
    sentences = tokenize_sentences(
        tokenizer, ["Dante Alighieri was an Italian poet born in Florence in the year 1265.", "Rome is big."]
    )
    exact = encoder.embed(sentences)
    budget = encoder.embed(sentences, pack=1, token_budget=64)  # other batches: the model's tolerance
    np.testing.assert_allclose(budget, exact, rtol=MODEL_RTOL, atol=MODEL_ATOL)
    packed = encoder.embed(sentences, pack=3)
    assert sentences[0].lengths.max() > 1  # Alighieri: a word of several wordpieces, masked by one mask
    row = 0
    for s in sentences:
        for group in mask_groups(len(s.positions), 3):
            ids, at = list(s.windows[0]), {}
            for j in sorted(group, key=lambda j: -s.positions[j]):  # from the right: earlier positions stay put
                p, n = int(s.positions[j]), int(s.lengths[j])
                ids[p : p + n] = [tokenizer.mask_token_id]
                at[j] = p - sum(int(s.lengths[i]) - 1 for i in group if s.positions[i] < p)
            with torch.no_grad():
                states = encoder.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[3][0]
            for j in group:
                np.testing.assert_allclose(packed[row + j], states[at[j]].numpy(), atol=1e-5)
        row += len(s.positions)
    assert len(sentences[0].positions) > 3 and not np.allclose(packed, exact, atol=1e-3)  # approximate, not exact


@pytest.fixture
def onnx_encoder(encoder):
    """The same tiny BERT run by ONNX Runtime (graphs exported to the test session's cache)."""
    return Encoder(encoder.model, encoder.tokenizer, encoder.name, encoder.layer, runtime="onnx")


def test_onnx_backend_gives_the_torch_numbers_on_padded_batches(encoder, onnx_encoder, tokenizer):
    questions = ["Dante was born in [MASK] .", "The longest river of the country [MASK] flows into the sea .", "[MASK]"]
    probs, states = onnx_encoder.query(questions)
    want_probs, want_states = encoder.query(questions)
    np.testing.assert_allclose(probs, want_probs, atol=1e-6)
    np.testing.assert_allclose(states, want_states, atol=1e-5)
    sentences = tokenize_sentences(
        tokenizer, ["Dante Alighieri was an Italian poet born in Florence in the year 1265.", "Rome is big."]
    )
    for pack, budget in [(1, 1024), (1, 40), (3, 1024)]:  # budget 40: several batches, padded ones among them
        np.testing.assert_allclose(
            onnx_encoder.embed(sentences, budget, pack), encoder.embed(sentences, budget, pack), atol=1e-5
        )


def test_onnx_graphs_are_cached_and_a_corrupt_one_is_exported_again(encoder, onnx_encoder, monkeypatch):
    from bertknn.model import onnx_backend

    want, _ = encoder.query(["Rome is in [MASK] ."])
    onnx_encoder.query(["Rome is in [MASK] ."])
    (graph,) = [r.path for r in onnx_encoder.graphs().values()]
    exports = []
    real_export = onnx_backend.export
    monkeypatch.setattr(onnx_backend, "export", lambda *a: exports.append(a) or real_export(*a))
    again = Encoder(encoder.model, encoder.tokenizer, encoder.name, encoder.layer, runtime="onnx")
    np.testing.assert_allclose(again.query(["Rome is in [MASK] ."])[0], want, atol=1e-6)
    assert exports == []  # read from the cache
    graph.write_bytes(graph.read_bytes()[:1000])  # truncated
    third = Encoder(encoder.model, encoder.tokenizer, encoder.name, encoder.layer, runtime="onnx")
    np.testing.assert_allclose(third.query(["Rome is in [MASK] ."])[0], want, atol=1e-6)
    assert len(exports) == 1 and graph.stat().st_size > 1000


def test_two_threads_opening_graphs_at_once_export_them_one_at_a_time(encoder, tmp_path, monkeypatch):
    """The sentence weights embed a question's text in a thread of their own while the LM's pass runs: the first
    question of a process may export two graphs at once (PyTorch's exporter keeps global state)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("BERTKNN_CACHE", str(tmp_path))  # nothing exported yet
    onnx = Encoder(encoder.model, encoder.tokenizer, encoder.name, encoder.layer, runtime="onnx")
    texts, start = ["Rome is in Italy.", "Oslo."], threading.Barrier(2)
    with ThreadPoolExecutor(2) as pool:
        beside = pool.submit(lambda: (start.wait(), onnx.sentence_vectors(texts, threads=1))[1])
        asked = pool.submit(lambda: (start.wait(), onnx.query(["Rome is in [MASK] ."]))[1])
        vectors, (probs, _) = beside.result(), asked.result()
    np.testing.assert_allclose(vectors, encoder.sentence_vectors(texts), atol=1e-5)
    np.testing.assert_allclose(probs, encoder.query(["Rome is in [MASK] ."])[0], atol=1e-6)
    assert sorted(onnx.graphs()) == ["mask_outputs", "mean_states-t1"]


def test_with_an_onnx_backend_onnx_runtime_takes_the_threads_and_pytorch_keeps_one(encoder):
    from bertknn.model.runtime import Runtime

    def session_threads() -> int:
        onnx = Encoder(encoder.model, encoder.tokenizer, encoder.name, encoder.layer, runtime="onnx")
        onnx.query(["Rome is in [MASK] ."])
        (runner,) = onnx.graphs().values()
        options = runner.session().get_session_options()
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"  # idle threads sleep
        return options.intra_op_num_threads

    try:
        Runtime("onnx", threads=2).apply()
        assert torch.get_num_threads() == 1 and session_threads() == 2
        Runtime("torch", threads=3).apply()  # ONNX Runtime, should it run, takes PyTorch's count
        assert torch.get_num_threads() == 3 and session_threads() == 3
    finally:
        Runtime(threads=1).apply()


def test_unknown_backend_is_refused(encoder):
    with pytest.raises(ValueError, match=r"unknown backend .tensorrt.: use one of auto, torch, onnx, onnx-int8"):
        Encoder(encoder.model, encoder.tokenizer, encoder.name, runtime="tensorrt")


def test_a_model_onnx_cannot_trace_gets_an_error_that_names_the_way_out(encoder, monkeypatch, tmp_path):
    from bertknn.model import onnx_backend

    def fail(*args, **kwargs):
        raise RuntimeError("unsupported operator aten::weird\nmore detail")

    monkeypatch.setattr(onnx_backend.torch.onnx, "export", fail)
    onnx = Encoder(encoder.model, encoder.tokenizer, encoder.name, encoder.layer, runtime="onnx")
    monkeypatch.setenv("BERTKNN_CACHE", str(tmp_path))
    with pytest.raises(onnx_backend.ExportError, match=r"\(RuntimeError: unsupported operator aten::weird\); use --"):
        onnx.query(["Rome is in [MASK] ."])
    assert not list(tmp_path.rglob("*.onnx"))


def test_onnx_int8_backend_quantises_questions_only(encoder, tokenizer):
    int8 = Encoder(encoder.model, encoder.tokenizer, encoder.name, encoder.layer, runtime="onnx-int8")
    questions = ["Dante was born in [MASK] .", "The longest river of the country [MASK] flows into the sea ."]
    (probs, states), (want_probs, want_states) = int8.query(questions), encoder.query(questions)
    cosine = (states * want_states).sum(1) / np.linalg.norm(states, axis=1) / np.linalg.norm(want_states, axis=1)
    assert cosine.min() > 0.95 and not np.allclose(states, want_states, atol=1e-3)  # approximate
    np.testing.assert_allclose(probs.sum(1), 1, atol=1e-5)
    assert not np.array_equal(probs, want_probs)  # the LM distribution is computed in int8 too
    sentences = tokenize_sentences(tokenizer, ["Rome is a big city in Italy."])
    np.testing.assert_allclose(int8.embed(sentences), encoder.embed(sentences), atol=1e-5)  # keys stay float32


def test_keys_are_batched_under_a_cpu_s_budget_on_a_cpu_and_a_gpu_s_on_a_gpu(encoder, tokenizer, monkeypatch):
    from bertknn.model import encoder as module

    budgets = []
    batches = module.length_batches
    monkeypatch.setattr(
        module, "length_batches", lambda lengths, budget: (budgets.append(budget), batches(lengths, budget))[1]
    )
    sentences = tokenize_sentences(tokenizer, ["Rome is big."])
    encoder.embed(sentences)
    encoder.embed(sentences, token_budget=64)
    monkeypatch.setattr(type(encoder.runtime), "torch_device", property(lambda self: torch.device("cuda")))
    assert encoder.key_budget == module.GPU_TOKEN_BUDGET  # what a GPU's small batches would leave idle: bench/README.md
    assert budgets == [module.TOKEN_BUDGET, 64]
