"""Quality of the offline default model (LM alone): held-out masked-word accuracy and LAMA P@1.

    python bench/head_quality.py [--data ../shared/data] [--per-relation 30] [--seed 0] [--model M] [--corpus F]
                                 [--smoke]

Held-out accuracy: one [MASK] per sentence of held-out documents (never trained on), on a random wordpiece and on a
random content word (a datastore target). LAMA: the LM alone on T-REx + Google-RE template questions, sampled per
relation, for facts whose subject's document is held out (and, for comparison, for all subjects). --model: another
head to compare, e.g. a directory saved from `load_default_model(head_file)` with `save_pretrained`. --corpus: the
documents to hold out sentences of [default: the evidence corpus of --data]. --smoke: the first 40 evidence
documents, 20 held-out sentences, 1 fact per relation, one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch
from evidence import SMOKE, smoke_corpus

from bertknn.evaluation.facts import load_lama, sample_per_relation
from bertknn.evaluation.metrics import macro_metrics, rank_of
from bertknn.model.default_model import DEFAULT_MODEL
from bertknn.model.encoder import Encoder
from bertknn.model.runtime import Runtime
from bertknn.model.train_head import evaluate, is_heldout, load_split


def lm_alone(encoder: Encoder, facts: list) -> dict:
    ranks = []
    for start in range(0, len(facts), 64):
        batch = facts[start : start + 64]
        probs, _ = encoder.query([f.question for f in batch])
        ranks += [rank_of(p, f.answer_id) for p, f in zip(probs, batch)]
    return macro_metrics(facts, ranks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.environ.get("BERTKNN_DATA", "../shared/data"))
    parser.add_argument("--per-relation", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--corpus", type=Path, default=None, help="[default: --data's evidence corpus]")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.corpus, args.sentences, args.per_relation, args.threads = smoke_corpus(), 20, 1, 1
    Runtime(threads=args.threads).apply()
    t0 = time.time()
    encoder = Encoder.load(args.model)
    corpus = args.corpus or Path(args.data) / "wiki" / "lama_evidence_docs.jsonl"
    _, held = load_split(corpus, encoder.tokenizer, 48)
    held = random.Random(args.seed + 1).sample(held, min(args.sentences, len(held)))
    with torch.inference_mode():
        words = evaluate(encoder.model, held, encoder.mask_id, args.seed)
    facts = load_lama(Path(args.data) / "lama", encoder.tokenizer, groups=("T-REx", "Google-RE"))
    heldout_facts = sample_per_relation([f for f in facts if is_heldout(f.subject)], args.per_relation, args.seed)
    all_facts = sample_per_relation(facts, args.per_relation, args.seed)
    result = {
        "heldout_words": words,
        "lama_heldout_subjects": lm_alone(encoder, heldout_facts)["macro"] | {"facts": len(heldout_facts)},
        "lama_all_subjects": lm_alone(encoder, all_facts)["macro"] | {"facts": len(all_facts)},
        "seconds": round(time.time() - t0),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
