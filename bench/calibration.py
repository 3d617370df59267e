"""Calibration, fitted and measured: the temperature and LM floor of the probabilities BERT-kNN shows
(`combine.calibrate`), chosen on a LAMA dev split and checked on the report's sample, in one run.

    python bench/calibration.py [--dev 5] [--test 30] [--temperatures 1,1.25,1.5,2,3] [--floors 0,0.01,...,0.7]
                                [--sentence-temperature T] [--corpus F] [--smoke]

Dev: `tune.DevSplit` (--dev facts per T-REx and Google-RE relation, seed 1), asked with and without subjects; test:
the report's sample (`eval lama --sample-per-relation --test --heldout-only`: T-REx and Google-RE, seed 0), asked
with subjects (its documents are the ones `eval lama` embedded). Both on the lazy datastore of the evidence corpus
that `eval lama` uses (cached), through `predict_batch` with bertknn's defaults left uncalibrated
(confidence_temperature 1, lm_floor 0); each (temperature, floor) of the grid is then applied to the same
distributions. Chosen: the lowest mean negative log-likelihood of the gold answer on dev,
both subject modes together. Printed per split and mode, uncalibrated and chosen: that NLL, the expected calibration
error of the top answer (`evaluation.calibration`), and P@1, also with bertknn's calibration (`settings`).
--sentence-temperature: all of it with the sentence weights at that temperature (default 0: off, as the calibration was
fitted). --corpus: another corpus than the evidence corpus (its lazy datastore cached alike). --smoke: a lazy datastore
of the first 40 evidence documents (in a temporary directory), 8 dev and 8 test facts (1 per relation), a grid of 2
temperatures and 2 floors, one thread.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
from evidence import DATA, EVIDENCE, SMOKE, SMOKE_FACTS, smoke_corpus


def _asked(reader, facts, with_subject: bool, options: dict) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """(p over the question's words, the LM's p over them, gold index) per fact, uncalibrated (`options`: more
    query settings)."""
    from bertknn.evaluation.facts import ir_subject

    subjects = [ir_subject(f) if with_subject else None for f in facts]
    found = reader.predict_batch(
        [f.question for f in facts],
        subjects,
        top_k=1,
        evidence=0,
        batch_size=32,
        confidence_temperature=1.0,
        lm_floor=0.0,
        **options,
    )
    return [(p.p, p.p_bert, f.answer_id) for p, f in zip(found, facts)]


def _measures(asked, temperature: float, floor: float) -> tuple[float, float, float]:
    """Mean NLL of the gold answer, ECE of the top answer, P@1 (%), after `calibrate`."""
    from bertknn.evaluation.metrics import calibration
    from bertknn.query.combine import calibrate

    nll, confidence, correct = [], [], []
    for p, p_lm, gold in asked:
        q = calibrate(p, p_lm, temperature, floor)
        nll.append(-np.log(max(q[gold], 1e-12)))
        top = int(np.argmax(q))
        confidence.append(q[top])
        correct.append(top == gold)
    return float(np.mean(nll)), 100 * calibration(confidence, correct)["ece"], 100 * float(np.mean(correct))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dev", type=int, default=5, help="dev facts per relation")
    parser.add_argument("--test", type=int, default=30, help="facts per relation of the report's sample")
    parser.add_argument("--temperatures", default="1,1.25,1.5,2,3")
    parser.add_argument("--floors", default="0,0.01,0.03,0.1,0.2,0.3,0.4,0.5,0.6,0.7")
    parser.add_argument("--model", default="bertknn/minilm-l6-mlm")
    parser.add_argument("--corpus", type=Path, default=EVIDENCE, help="the corpus [default: the evidence corpus]")
    parser.add_argument("--sentence-temperature", type=float, default=0.0, help="sentence weights [default: off]")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    directory, most = None, None
    if args.smoke:
        args.dev, args.test, args.temperatures, args.floors = 1, 1, "1,1.25", "0,0.4"
        args.corpus, most = smoke_corpus(), SMOKE_FACTS
        directory = args.corpus.parent / "store"
    from bertknn.evaluation.facts import GROUPS, fact_key, held_out, load_lama, sample_per_relation
    from bertknn.evaluation.run import lama_reader
    from bertknn.evaluation.tune import DevSplit
    from bertknn.model.encoder import Encoder
    from bertknn.model.runtime import Runtime
    from bertknn.query.settings import CONFIDENCE_TEMPERATURE, LM_FLOOR

    Runtime(threads=1 if args.smoke else os.cpu_count() or 1).apply()
    encoder = Encoder.load(args.model, runtime="onnx")
    facts = load_lama(DATA / "lama", encoder.tokenizer, GROUPS, warn=lambda m: None)
    facts = [f for f in facts if f.group in ("T-REx", "Google-RE")]
    dev = DevSplit(per_relation=args.dev, squad=0).choose(facts)
    taken = {fact_key(f) for f in dev}
    test = [f for f in sample_per_relation(held_out(facts), args.test, seed=0) if fact_key(f) not in taken]
    dev, test = dev[:most], test[:most]
    reader = lama_reader(args.corpus, encoder, directory)
    grid = [(float(t), float(f)) for t in args.temperatures.split(",") for f in args.floors.split(",")]
    options = {"sentence_temperature": args.sentence_temperature}
    asked = {
        ("dev", "subject"): _asked(reader, dev, True, options),
        ("dev", "no subject"): _asked(reader, dev, False, options),
        ("test", "subject"): _asked(reader, test, True, options),
    }
    dev_runs = asked[("dev", "subject")] + asked[("dev", "no subject")]
    nll = {g: _measures(dev_runs, *g)[0] for g in grid}
    best = min(grid, key=lambda g: (nll[g], g))
    print(f"\n## Calibration: LAMA dev {len(dev)} facts, test {len(test)} facts (the report's sample less dev)")
    print(f"sentence_temperature {args.sentence_temperature:g}\n")
    print("Dev NLL of the gold answer per temperature (rows) and floor (columns):\n")
    floors = sorted({f for _, f in grid})
    print("| temperature | " + " | ".join(f"floor {f:g}" for f in floors) + " |")
    print("|---" * (len(floors) + 1) + "|")
    for t in sorted({t for t, _ in grid}):
        print(f"| {t:g} | " + " | ".join(f"{nll[(t, f)]:.3f}" for f in floors) + " |")
    print(f"\nchosen: confidence_temperature {best[0]:g}, lm_floor {best[1]:g}\n")
    print("| split | subject | calibration | NLL | ECE | P@1 (micro) |\n|---|---|---|---|---|---|")
    for (split, mode), runs in asked.items():
        for name, g in (("none", (1.0, 0.0)), ("bertknn's", (CONFIDENCE_TEMPERATURE, LM_FLOOR)), ("chosen", best)):
            n, ece, p1 = _measures(runs, *g)
            print(f"| {split} | {mode} | {name} | {n:.3f} | {ece:.1f} | {p1:.1f} |", flush=True)


if __name__ == "__main__":
    main()
