"""The runtime record (engine, device, dtype, threads) and the model on it, on CPU; CUDA paths where a GPU exists."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertknn.model.encoder import Encoder
from bertknn.model.runtime import Runtime, cuda_devices
from bertknn.text import tokenize_sentences

from ..conftest import writable
from ..tolerances import MODEL_RTOL

GPU = cuda_devices() > 0
QUESTIONS = ["Dante was born in [MASK] .", "The longest river of the country [MASK] flows into the sea ."]


def test_backend_names_device_and_dtype_make_one_runtime():
    assert Runtime.of("auto") == (Runtime("torch", device="cuda") if GPU else Runtime("onnx"))
    assert Runtime.of("auto", dtype="bf16") == Runtime("torch", dtype="bfloat16", device="cuda" if GPU else "cpu")
    assert Runtime.of("onnx-int8", threads=2) == Runtime("onnx", int8_questions=True, threads=2)
    assert Runtime(dtype="fp32").dtype == "float32" and Runtime(dtype="bf16").torch_dtype == torch.bfloat16
    assert Runtime.of("onnx-int8").backend == "onnx-int8" and Runtime().torch_device == torch.device("cpu")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"device": "gpu"}, "unknown device 'gpu': use auto, cpu, cuda or cuda:N"),
        ({"dtype": "int4"}, "unknown dtype 'int4'"),
        ({"dtype": "fp16", "device": "cpu"}, "float16 runs on a GPU only: on CPU use --dtype bfloat16"),
        ({"engine": "onnx", "dtype": "bf16"}, "the onnx engine runs float32 graphs: --dtype bfloat16 needs --backend"),
        ({"engine": "torch", "int8_questions": True}, "int8 questions run in ONNX Runtime"),
        ({"threads": -1}, "threads must be a whole number >= 0"),
        ({"device": f"cuda:{cuda_devices()}"}, f"PyTorch sees {cuda_devices()} CUDA GPU"),
    ],
)
def test_what_cannot_run_here_is_refused_with_the_way_out(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Runtime(**options)


def test_a_remote_runtime_is_checked_on_the_machine_that_runs_it():
    gpus = cuda_devices()
    remote = Runtime.of("auto", device=f"cuda:{gpus}", dtype="fp16", remote=True)  # nothing here can run it
    assert (remote.engine, remote.device, remote.dtype, remote.remote) == ("torch", f"cuda:{gpus}", "float16", True)
    with pytest.raises(ValueError, match=f"PyTorch sees {gpus} CUDA GPU"):
        remote.here()
    assert Runtime.of("auto", device="auto", remote=True).here() == Runtime("torch", device="cuda" if GPU else "cpu")
    with pytest.raises(ValueError, match="unknown device 'gpu'"):  # what is wrong anywhere is refused at once
        Runtime.of("torch", device="gpu", remote=True)


@pytest.fixture(scope="module")
def bf16(tiny_model_dir):
    """The tiny BERT in bfloat16 (its own copy: the Encoder moves its model)."""
    return Encoder.load(str(tiny_model_dir), runtime=Runtime(dtype="bfloat16"))


def test_a_bf16_encoder_is_the_same_model_with_close_outputs(bf16, encoder, tokenizer):
    assert bf16.weights_hash == encoder.weights_hash  # a datastore is the same model's in any dtype
    assert next(bf16.model.parameters()).dtype == torch.bfloat16 and bf16.trunk is not None
    probs, states = bf16.query(QUESTIONS)
    want_probs, want_states = encoder.query(QUESTIONS)
    assert probs.dtype == states.dtype == np.float32
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=MODEL_RTOL)  # 30,522 float32 probabilities summed
    assert cosine_rows(states, want_states).min() > 0.99 and np.abs(probs - want_probs).max() < 0.01
    sentences = tokenize_sentences(tokenizer, ["Dante Alighieri was an Italian poet born in Florence in 1265."])
    keys, exact = bf16.embed(sentences), encoder.embed(sentences)
    assert keys.dtype == np.float32 and cosine_rows(keys, exact).min() > 0.99
    with pytest.raises(ValueError, match="int8 keys are computed by ONNX Runtime on CPU"):
        bf16.embed(sentences, int8_keys=True)


def test_another_layer_of_a_moved_model_runs_where_the_model_is(bf16):
    other = bf16.at_layer(2)
    assert other.runtime == bf16.runtime and other.model is bf16.model
    assert other.query(QUESTIONS[:1])[1].shape == (1, bf16.dim)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_on_a_gpu_keys_and_questions_match_the_cpu(tiny_model_dir, encoder, tokenizer):
    gpu = Encoder.load(str(tiny_model_dir), runtime=Runtime(device="cuda"))
    np.testing.assert_allclose(gpu.query(QUESTIONS)[1], encoder.query(QUESTIONS)[1], atol=1e-4)
    sentences = tokenize_sentences(tokenizer, ["Rome is the capital of Italy."])
    np.testing.assert_allclose(gpu.embed(sentences), encoder.embed(sentences), atol=1e-4)


def test_a_store_records_the_dtype_of_its_keys_and_is_extended_only_in_it(bf16, encoder, small_corpus, tmp_path):
    from bertknn import BertKNN, DatastoreError

    knn = BertKNN.build(small_corpus, tmp_path / "bf16", bf16)
    assert knn.store.manifest.key_dtype == "bfloat16" and knn.store.manifest["key_dtype"] == "bfloat16"
    exact = BertKNN.build(small_corpus, tmp_path / "f32", encoder)
    assert exact.store.manifest.key_dtype == "float32"
    keys, want = np.asarray(knn.store.keys, np.float32), np.asarray(exact.store.keys, np.float32)
    assert cosine_rows(keys, want).min() > 0.99
    float32_reader = writable(encoder, knn.store)  # questions in float32 over bf16 keys: fine
    assert float32_reader.predict("Ilsa Varnhold was born in [MASK] .", "Ilsa Varnhold").documents == ["Ilsa Varnhold"]
    doc = {"id": "n1", "title": "Tamsin Orwhey", "text": "Tamsin Orwhey was born in Tallinn."}
    with pytest.raises(DatastoreError, match="computed in bfloat16: embed its documents with --dtype bfloat16"):
        float32_reader.add_documents([doc])
    assert float32_reader.store.n_documents == 5  # refused before anything was staged
    assert knn.add_documents([doc]) > 0


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
