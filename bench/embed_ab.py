"""Key speed of two versions of bertknn, A/B: `Encoder.embed` exact and --pack 4, contexts/s (best of 3 calls).

    git worktree add /tmp/before REV
    for i in 1 2 3; do
        PYTHONPATH=/tmp/before/src .venv/bin/python bench/embed_ab.py
        PYTHONPATH=src .venv/bin/python bench/embed_ab.py
    done

Each run is one fresh process on the source tree PYTHONPATH names (printed first); alternate them so a slow spell
of the machine hits both. Model: bert-base-shaped, random weights (seed 0), 2 threads; contexts: the first ~300 of
$BERTKNN_DATA/wiki/lama_evidence_docs.jsonl, read with `iter_corpus`, split with pysbd and tokenized by
`tokenize_sentences` (functions both versions have). Used for the before/after table of bench/README.md.
--smoke: about 20 contexts, 1 call each and a 2-block, 64-wide random BERT.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from evidence import SMOKE, SMOKE_BERT
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

import bertknn
from bertknn.text import iter_corpus, split_sentences, tokenize_sentences

try:
    from bertknn.model.default_model import base_model_dir
    from bertknn.model.encoder import Encoder
except ImportError:  # a version from before the subpackages
    from bertknn.default_model import base_model_dir
    from bertknn.encoder import Encoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    contexts, calls, threads, shape = (20, 1, 1, SMOKE_BERT) if args.smoke else (300, 3, 2, {})
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir())
    torch.manual_seed(0)
    encoder = Encoder(BertForMaskedLM(BertConfig(vocab_size=tokenizer.vocab_size, **shape)).eval(), tokenizer, "x")
    path = Path(os.environ.get("BERTKNN_DATA", "../shared/data")) / "wiki" / "lama_evidence_docs.jsonl"
    sentences, total = [], 0
    for doc in iter_corpus(path):
        for s in tokenize_sentences(tokenizer, [x for p in doc.passages for x in split_sentences(p)]):
            sentences.append(s)
            total += len(s.positions)
        if total >= contexts:
            break
    encoder.embed(sentences[:2])  # warm up
    rates = {}
    for name, options in (("exact", {}), ("pack4", {"pack": 4})):
        times = []
        for _ in range(calls):
            began = time.perf_counter()
            encoder.embed(sentences, **options)
            times.append(time.perf_counter() - began)
        rates[name] = round(total / min(times), 1)
    print(bertknn.__file__.split("/src/")[0], total, rates)


if __name__ == "__main__":
    main()
