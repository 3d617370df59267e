"""Build and question throughput on one device (a GPU where there is one): bertknn's key path vs the reference.

    python bench/gpu_build.py [--device auto] [--contexts 20000] [--budgets 2048,8192,32768] [--dtypes float32,bf16]
                              [--questions 2048] [--threads N] [--smoke]

Model: bert-base-shaped (12 blocks, 768 wide, random weights; speed does not depend on the weights) with the real
bert-base-uncased tokenizer; keys from block 11. Contexts: the evidence corpus's first sentences, read as a build
reads them ($BERTKNN_DATA/wiki). Reference (as the authors' code does it): one full masked-LM forward per context,
logits at every position, corpus order, batches of 124, float32, on the same device. bertknn: `Encoder.embed`
(blocks 1..11 only, no head, length-sorted batches under a token budget) in each dtype and budget; key cosine vs
the reference keys. Questions: cloze questions made from the same sentences (a target masked), `Encoder.query`
batched (questions/s) and one at a time (p50). On a GPU, its utilisation is sampled with nvidia-smi during the
bertknn runs. The same script runs on CPU (`--device cpu`) with smaller sizes. Last line: the figures as JSON.
--smoke: about 20 contexts, one token budget, 16 questions and a 2-block, 64-wide random BERT, on --device (auto: a GPU
where there is one, else the CPU).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import threading
import time

import numpy as np
import torch
from build_throughput import cosines, load_sentences, reference_keys
from evidence import SMOKE, SMOKE_BERT
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

from bertknn.model.default_model import base_model_dir
from bertknn.model.encoder import Encoder
from bertknn.model.runtime import Runtime


def synced(device: torch.device, fn, *args):
    """(seconds, result) of fn(*args), waiting for the device to finish."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    result = fn(*args)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - began, result


class Utilisation:
    """GPU utilisation (%) sampled by nvidia-smi every 0.2 s while in use; None on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.samples, self.stop = device, [], threading.Event()

    def _sample(self) -> None:
        query = ["nvidia-smi", f"--id={self.device.index or 0}", "--query-gpu=utilization.gpu", "--format=csv,noheader"]
        while not self.stop.wait(0.2):
            out = subprocess.run(query, capture_output=True, text=True, check=False).stdout.strip()
            if out.rstrip(" %").isdigit():
                self.samples.append(int(out.rstrip(" %")))

    def __enter__(self) -> Utilisation:
        if self.device.type == "cuda":
            threading.Thread(target=self._sample, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()

    @property
    def mean(self) -> float | None:
        return round(float(np.mean(self.samples)), 1) if self.samples else None


def questions_of(sentences: list, n: int) -> list[str]:
    """n cloze questions: each sentence with one of its targets masked (cycling through the sentences)."""
    out = []
    for s in sentences:
        for a, b in s.spans[:2]:
            out.append(f"{s.text[:a]}[MASK]{s.text[b:]}")
    return (out * (1 + n // max(len(out), 1)))[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--contexts", type=int, default=20000)
    parser.add_argument("--budgets", default="2048,8192,32768")
    parser.add_argument("--dtypes", default="float32,bf16")
    parser.add_argument("--questions", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    shape = {}
    if args.smoke:
        args.contexts, args.budgets, args.questions, args.threads, shape = 20, "2048", 16, 1, SMOKE_BERT
    Runtime(threads=args.threads).apply()
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir())
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=tokenizer.vocab_size, **shape)).eval()
    layer = model.config.num_hidden_layers - 1  # block 11 of bert-base
    model_name = "small-random" if args.smoke else "bert-base-shaped-random"
    encoders = {
        dtype: Encoder(copy.deepcopy(model), tokenizer, model_name, layer, Runtime(device=args.device, dtype=dtype))
        for dtype in args.dtypes.split(",")
    }
    runtime = next(iter(encoders.values())).runtime
    device = runtime.torch_device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} threads"
    sentences = load_sentences(next(iter(encoders.values())), args.contexts)
    n = sum(len(s.positions) for s in sentences)
    print(f"device {runtime.device} ({name}); {n} contexts from {len(sentences)} sentences; torch {torch.__version__}")
    reference_model = copy.deepcopy(model).to(device)
    with torch.inference_mode():
        reference_keys(reference_model, sentences[:4], layer, tokenizer.mask_token_id, device=runtime.device)  # warm up
        seconds, exact = synced(
            device, reference_keys, reference_model, sentences, layer, tokenizer.mask_token_id, 124, runtime.device
        )
    del reference_model
    figures = {"device": name, "contexts": n, "reference": round(n / seconds, 1), "build": {}, "questions": {}}
    print(f"reference (full MLM forward, batches of 124, float32): {n / seconds:,.1f} contexts/s")
    print("| dtype | token budget | contexts/s | vs reference | key cosine mean | min | GPU utilisation % |")
    print("|---|---|---|---|---|---|---|")
    for encoder in encoders.values():
        for budget in map(int, args.budgets.split(",")):
            encoder.embed(sentences[:8], budget)  # warm up
            with Utilisation(device) as gpu:
                seconds, keys = synced(device, encoder.embed, sentences, budget)
            c = cosines(keys, exact)
            rate = n / seconds
            figures["build"][f"{encoder.runtime.dtype}/{budget}"] = round(rate, 1)
            print(
                f"| {encoder.runtime.dtype} | {budget:,} | {rate:,.1f} | {rate / figures['reference']:.2f}x "
                f"| {c.mean():.4f} | {c.min():.4f} | {gpu.mean if gpu.mean is not None else 'n/a'} |"
            )
    questions = questions_of(sentences, args.questions)
    for encoder in encoders.values():
        encoder.query(questions[:8])
        seconds, _ = synced(device, encoder.query, questions)
        single = [synced(device, encoder.query, [q])[0] for q in questions[:50]]
        p50 = 1000 * float(np.median(single))
        figures["questions"][encoder.runtime.dtype] = {
            "per_s": round(len(questions) / seconds, 1),
            "p50_ms": round(p50, 2),
        }
        print(f"questions, {encoder.runtime.dtype}: {len(questions) / seconds:,.1f}/s batched, p50 {p50:.2f} ms alone")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
