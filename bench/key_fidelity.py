"""Speed and fidelity of the key options on the offline default model: token budget, --pack, --backend, int8.

    python bench/key_fidelity.py [--sentences 150] [--threads 2] [--smoke]

Sentences: --sentences sentences of evidence-corpus documents 5,000 on ($BERTKNN_DATA/wiki). Every option embeds the
same sentences once; keys are compared by cosine with the exact keys (one target masked per pass, 1,024-token
batches). `--backend onnx` runs the same keys in ONNX Runtime. int8 is dynamic quantisation of every Linear layer /
MatMul, by PyTorch (measured, not offered) or by ONNX Runtime per channel (`--int8-keys`). For an int8 question
graph (not offered) the LM's top-1 word is also compared with float32's on cloze questions made from the same
sentences (first words + [MASK]). The last line prints the contexts/s ratio of --pack 2 to exact. --smoke: 10
sentences, one thread.
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from evidence import SMOKE

from bertknn.model.encoder import Encoder
from bertknn.model.runtime import Runtime
from bertknn.text import iter_corpus, split_sentences, tokenize_sentences


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=150)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.sentences, args.threads = 10, 1
    Runtime(threads=args.threads).apply()
    encoder = Encoder.load()
    corpus = Path(os.environ.get("BERTKNN_DATA", "../shared/data")) / "wiki" / "lama_evidence_docs.jsonl"
    texts: list[str] = []
    for doc in itertools.islice(iter_corpus(corpus), 5000, None):
        texts += [s for p in doc.passages for s in split_sentences(p)]
        if len(texts) >= args.sentences:
            break
    sentences = tokenize_sentences(encoder.tokenizer, texts[: args.sentences])
    n = sum(len(s.positions) for s in sentences)
    print(f"{n} contexts from {len(sentences)} sentences; default model, block {encoder.layer}; {args.threads} threads")
    quantized = torch.ao.quantization.quantize_dynamic(encoder.model, {torch.nn.Linear}, dtype=torch.qint8)
    int8 = Encoder(quantized, encoder.tokenizer, encoder.name, encoder.layer)
    tmp = tempfile.TemporaryDirectory()
    os.environ["BERTKNN_CACHE"] = tmp.name  # exported graphs go away with it
    fast = Encoder(encoder.model, encoder.tokenizer, encoder.name, encoder.layer, "onnx")
    questions = [" ".join(t.split()[:6]) + " [MASK] ." for t in texts[: args.sentences] if len(t.split()) > 6]
    (
        fast.embed(sentences[:1]),
        fast.embed(sentences[:1], int8_keys=True),
    )  # export and quantise the key graph (not timed)
    onnx8 = Encoder(fast.model, fast.tokenizer, fast.name, fast.layer, "onnx-int8")  # questions in int8
    options = {
        "exact (default)": lambda s: encoder.embed(s),
        "exact, 8,192-token batches": lambda s: encoder.embed(s, token_budget=8192),
        "--pack 2": lambda s: encoder.embed(s, pack=2),
        "--pack 4": lambda s: encoder.embed(s, pack=4),
        "--backend onnx": fast.embed,
        "int8, PyTorch (not offered)": int8.embed,
        "int8, ONNX Runtime per channel (--int8-keys)": lambda s: fast.embed(s, int8_keys=True),
    }
    print("| option | contexts/s | cosine vs exact: mean | 5th percentile | min |")
    print("|---|---|---|---|---|")
    rates, exact = {}, None
    for name, run in options.items():
        t = time.perf_counter()
        keys = run(sentences)
        rates[name] = n / (time.perf_counter() - t)
        exact = keys if exact is None else exact
        c = cosines(keys, exact)
        print(f"| {name} | {rates[name]:.1f} | {c.mean():.4f} | {np.percentile(c, 5):.4f} | {c.min():.4f} |")
    agree = np.mean(fast.query(questions)[0].argmax(1) == onnx8.query(questions)[0].argmax(1))
    print(f"ONNX int8 question graph vs float32: LM top-1 word agrees on {agree:.1%} of {len(questions)} questions")
    print(f"contexts/s ratio --pack 2 / exact: {rates['--pack 2'] / rates['exact (default)']:.2f}x")


if __name__ == "__main__":
    main()
