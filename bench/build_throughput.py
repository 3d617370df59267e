"""Datastore build throughput: bertknn's embedding path vs the reference approach, same sentences, same process.

    python bench/build_throughput.py [--contexts 600] [--rounds 2] [--threads 2] [--smoke]

Model: bert-base-shaped (12 blocks, 768 wide, random weights; speed does not depend on the weights) with the real
bert-base-uncased tokenizer. Sentences: the evidence corpus ($BERTKNN_DATA/wiki, default ../shared/data/wiki).
Reference approach (as the authors' code does it): one full masked-LM forward per context, logits at every position,
contexts in corpus order in batches of 124. bertknn: blocks 1..L only, no head, contexts sorted by length and
batched under a token budget. Runs alternate; the keys of both are compared. Then each speed option once: the old
token budget, ONNX Runtime (--backend onnx; graph exported first, not timed), multi-mask packing (--pack 2, 4),
int8 keys (--int8-keys, alone and with --pack 2), PyTorch int8 dynamic quantisation; with key cosines vs the exact
keys.
The last line prints the ratio of the --pack 4 build to the reference. --smoke: about 20 contexts, 1 round and a
2-block, 64-wide random BERT.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from evidence import SMOKE, SMOKE_BERT
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

from bertknn.ingest import builder
from bertknn.ingest.corpus import record
from bertknn.model.default_model import base_model_dir
from bertknn.model.encoder import Encoder
from bertknn.model.runtime import Runtime
from bertknn.text import iter_corpus, masked

DEFAULT_PACK = 4  # the option whose ratio is the headline (its fidelity is printed beside it)


def load_sentences(encoder: Encoder, n_contexts: int) -> list:
    """The evidence corpus's sentences as a build reads them, whole documents until they hold n_contexts targets."""
    path = Path(os.environ.get("BERTKNN_DATA", "../shared/data")) / "wiki" / "lama_evidence_docs.jsonl"
    out, total = [], 0
    for doc in iter_corpus(path):
        found = builder.contexts(encoder, list(record(doc, "pysbd").sentences))  # the figures' sentences
        out += found
        total += sum(len(s.positions) for s in found)
        if total >= n_contexts:
            break
    return out


@torch.inference_mode()  # no autograd graph: the reference runs inference too
def reference_keys(
    model, sentences: list, layer: int, mask_id: int, batch: int = 124, device: str = "cpu"
) -> np.ndarray:
    """The reference approach: full MLM forward (logits everywhere), corpus order, batches of 124, padded; the model
    and the batches on `device`."""
    contexts = [  # the target's pieces replaced by one mask, as a datastore of whole words keys it
        (ids, int(at[0]))
        for s in sentences
        for w, p, n in zip(s.window, s.positions, s.lengths)
        for ids, at in [masked(s.windows[w], np.array([p]), np.array([n]), mask_id)]
    ]
    keys = []
    for start in range(0, len(contexts), batch):
        part = contexts[start : start + batch]
        width = max(len(window) for window, _ in part)
        ids = torch.zeros((len(part), width), dtype=torch.long)
        attention = torch.zeros_like(ids)
        for i, (window, p) in enumerate(part):
            ids[i, : len(window)] = torch.from_numpy(window)
            attention[i, : len(window)] = 1
            ids[i, p] = mask_id
        out = model(input_ids=ids.to(device), attention_mask=attention.to(device), output_hidden_states=True)
        out.logits.sum()  # the logits at every position are computed, as in the reference
        rows = torch.arange(len(part))
        keys.append(out.hidden_states[layer][rows, torch.tensor([p for _, p in part])].float().cpu().numpy())
    return np.concatenate(keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    shape = {}
    if args.smoke:
        args.contexts, args.rounds, args.threads, shape = 20, 1, 1, SMOKE_BERT
    Runtime(threads=args.threads).apply()
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir())
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=tokenizer.vocab_size, **shape)).eval()  # bert-base shape unless smoke
    encoder = Encoder(model, tokenizer, "small-random" if args.smoke else "bert-base-shaped-random")
    sentences = load_sentences(encoder, args.contexts)
    n = sum(len(s.positions) for s in sentences)
    print(f"{n} contexts from {len(sentences)} sentences; layer {encoder.layer}; {args.threads} threads")
    times = {"reference": [], "bertknn": []}
    for _ in range(args.rounds):
        t = time.perf_counter()
        ref = reference_keys(model, sentences, encoder.layer, tokenizer.mask_token_id)
        times["reference"].append(time.perf_counter() - t)
        t = time.perf_counter()
        ours = encoder.embed(sentences)
        times["bertknn"].append(time.perf_counter() - t)
    rates = {k: n / min(v) for k, v in times.items()}
    diff = float(np.abs(ours - ref).max())
    print(f"reference: {rates['reference']:.1f} contexts/s; bertknn exact: {rates['bertknn']:.1f} contexts/s")
    print(
        f"exact keys: max |bertknn - reference| = {diff:.2e} (float32, before float16 storage); "
        f"min cosine {cosines(ours, ref).min():.6f}"
    )
    print("| option | contexts/s | vs reference | key cosine vs exact: mean | min |")
    print("|---|---|---|---|---|")
    best = rates["bertknn"]
    for name, run in variants(encoder, tokenizer, sentences):
        t = time.perf_counter()
        keys = run(sentences)
        rate = n / (time.perf_counter() - t)
        cos = cosines(keys, ours)
        print(f"| {name} | {rate:.1f} | {rate / rates['reference']:.2f}x | {cos.mean():.4f} | {cos.min():.4f} |")
        if name == f"pack {DEFAULT_PACK} (--pack {DEFAULT_PACK})":
            best = rate
    print(f"exact mode ratio bertknn/reference: {rates['bertknn'] / rates['reference']:.2f}x")
    print(f"build throughput ratio bertknn --pack {DEFAULT_PACK} / reference: {best / rates['reference']:.2f}x")


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def variants(encoder: Encoder, tokenizer, sentences: list):
    """The speed options, each as (name, sentences -> keys)."""
    yield "exact, old 8,192-token batches", lambda s: encoder.embed(s, token_budget=8192)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["BERTKNN_CACHE"] = tmp  # the exported graph goes away with it
        fast = Encoder(encoder.model, tokenizer, encoder.name, encoder.layer, runtime="onnx")
        fast.embed(sentences[:1])  # export, not timed
        yield "exact, ONNX Runtime (--backend onnx)", fast.embed
        fast.embed(sentences[:1], int8_keys=True)  # quantise, not timed
        yield "int8 keys, ONNX Runtime per channel (--int8-keys)", lambda s: fast.embed(s, int8_keys=True)
        yield "--int8-keys + --pack 2", lambda s: fast.embed(s, pack=2, int8_keys=True)
    for pack in (2, 4):
        yield f"pack {pack} (--pack {pack})", lambda s, pack=pack: encoder.embed(s, pack=pack)
    quantized = torch.ao.quantization.quantize_dynamic(encoder.model, {torch.nn.Linear}, dtype=torch.qint8)
    int8 = Encoder(quantized, tokenizer, encoder.name, encoder.layer)
    yield "int8 dynamic quantisation (not an option)", int8.embed
    yield "int8 + pack 4 (not an option)", lambda s: int8.embed(s, pack=4)


if __name__ == "__main__":
    main()
