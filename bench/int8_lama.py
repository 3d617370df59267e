"""LAMA P@1 with int8 keys (`--int8-keys`) and with int8 questions (`--backend onnx-int8`) vs float32, same sample.

    python bench/int8_lama.py [--sample-per-relation 30] [--corpus ../shared/data/wiki/lama_evidence_docs.jsonl]
                              [--smoke]

Offline default model. Keys: float32 or int8, questions in float32 (ONNX Runtime); then int8 questions over float32
keys. Facts: the report's sample (T-REx, Google-RE, SQuAD; subjects held out from head training; N per relation,
seed 0); the paper's hyperparameters (bertknn.query.settings.PAPER) for both. Both datastores are
the cached lazy ones of `bertknn eval lama` (without and with `--int8-keys`; built if missing, kept for reruns).
Cold, with 30 facts per relation, the int8 side embeds about 680k contexts: about 35 minutes on 2 cores (longer than
the other benches). The int8 questions run over the exact keys. Last lines: the P@1 changes. --smoke: lazy datastores
of the first 40 evidence documents and the results in a temporary directory, 8 facts (1 per relation), one thread.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from evidence import SMOKE, SMOKE_FACTS, scratch, smoke_corpus

from bertknn.evaluation.facts import KB_GROUPS, load_lama, sample_per_relation
from bertknn.evaluation.metrics import summarize
from bertknn.evaluation.run import evaluate_facts, lama_reader
from bertknn.model.encoder import Encoder, cache_dir
from bertknn.model.runtime import Runtime
from bertknn.model.train_head import is_heldout
from bertknn.query.prediction import METHODS
from bertknn.query.settings import PAPER


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = Path(os.environ.get("BERTKNN_DATA", "../shared/data"))
    parser.add_argument("--corpus", type=Path, default=data / "wiki" / "lama_evidence_docs.jsonl")
    parser.add_argument("--sample-per-relation", type=int, default=30)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.corpus, args.sample_per_relation, args.threads = smoke_corpus(), 1, 1
    Runtime("onnx", threads=args.threads).apply()
    fast = Encoder.load(runtime="onnx")
    facts = load_lama(data / "lama", fast.tokenizer, ("T-REx", "Google-RE", "SQuAD"), warn=lambda m: None)
    facts = [f for f in facts if f.group not in KB_GROUPS or is_heldout(f.subject)]
    facts = sample_per_relation(facts, args.sample_per_relation, 0)
    out = cache_dir() / "int8-lama"
    if args.smoke:
        facts, out = facts[:SMOKE_FACTS], scratch()
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    questions8 = Encoder.load(runtime="onnx-int8")
    for name, enc, int8 in (("exact", fast, False), ("int8", fast, True), ("int8-questions", questions8, False)):
        directory = out / f"store-{name}" if args.smoke else None
        reader = lama_reader(args.corpus, enc, directory, int8_keys=int8, **PAPER.hparams)
        rows = evaluate_facts(reader, facts, out / f"results-{name}-{args.sample_per_relation}.jsonl")
        metrics = summarize(rows)["sets"]["LAMA"]["metrics"]
        results[name] = {m: 100 * metrics[m]["P@1"] for m in METHODS}
        scores = ", ".join(f"{m} {v:.1f}" for m, v in results[name].items())
        print(f"{name}: {len(rows)} facts; LAMA P@1 {scores}")
    for name in ("int8", "int8-questions"):
        change = ", ".join(f"{m} {results[name][m] - results['exact'][m]:+.1f}" for m in METHODS)
        print(f"P@1 change with {'int8 keys' if name == 'int8' else 'int8 questions'}: {change}")


if __name__ == "__main__":
    main()
