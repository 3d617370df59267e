"""The key stage of a real build on one device at several token budgets: the default model's keys of the first N
documents of the evidence corpus (sentences split and tokenised as a build does), contexts/s and GPU utilisation.

    python bench/gpu/budget.py [--docs 2000] [--budgets 1024,4096,16384,32768,65536] [--device cuda] [--dtype bf16]

Why: a build on a GPU batched under a CPU's token budget (`encoder.TOKEN_BUDGET`) kept the GPU mostly idle
(bench/README.md, the whole build on a GPU); this measures what larger batches give (`encoder.GPU_TOKEN_BUDGET`).
Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from gpu_build import Utilisation, synced

from bertknn.ingest.builder import contexts
from bertknn.model.encoder import Encoder
from bertknn.model.runtime import Runtime
from bertknn.text import parse_document, split_sentences

DATA = Path(os.environ.get("BERTKNN_DATA", "../shared/data"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--budgets", default="1024,4096,16384,32768,65536")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16")
    args = parser.parse_args()
    texts = []
    with open(DATA / "wiki" / "lama_evidence_docs.jsonl", encoding="utf-8") as lines:
        for line, _ in zip(lines, range(args.docs)):
            document = parse_document(json.loads(line), "corpus")
            texts += [s for passage in document.passages for s in split_sentences(passage, "sentencex")]
    runtime = Runtime.of("torch", 0, args.device, args.dtype)
    encoder = Encoder.load(runtime=runtime)
    sentences = contexts(encoder, texts)
    n = sum(len(s.positions) for s in sentences)
    device = runtime.torch_device
    encoder.embed(sentences[:200], 4096)  # warm-up
    figures = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "contexts": n}
    print(f"{args.docs} documents, {len(sentences)} sentences, {n:,} contexts; {figures['device']} {args.dtype}")
    print("| token budget | contexts/s | GPU utilisation % |\n|---|---|---|")
    for budget in map(int, args.budgets.split(",")):
        with Utilisation(device) as use:
            seconds, _ = synced(device, encoder.embed, sentences, budget)
        figures[budget] = {"per_s": round(n / seconds, 1), "gpu": use.mean}
        print(f"| {budget:,} | {n / seconds:,.1f} | {figures[budget]['gpu']} |", flush=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
