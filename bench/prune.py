"""Pruned datastores (`bertknn prune`, ingest/prune.py): contexts kept, bytes per context, LAMA P@1, the fresh-facts
set and question time, per merging radius and key form.

    python bench/prune.py [--radii "none;20;40;80"] [--codecs "SQ4;PQ96"] [--dev 5] [--timed 60] [--corpus F] [--smoke]

Source: the lazy datastore of the evidence corpus that `eval lama` uses (the offline default model), after a first
pass embeds every document the dev questions retrieve. Per radius, `prune` writes a copy ("none": the store copied
as it is); LAMA dev (`tune.DevSplit`, --dev facts per T-REx and Google-RE relation) is asked with and without
subjects through `predict_batch` with bertknn's defaults. For each of --codecs, a copy of each pruned store is
converted (`Writer.convert_keys`, trained on 50,000 of its keys) and asked again. Then the 40 fresh-facts documents
(bench/fresh_facts/) are added to each form (stored unpruned: an add keeps every context) and its 120 questions
asked. Bytes per context: the entry files (keys or codes, values, counts) and store.sqlite, over the source's
contexts. --corpus: another corpus than the evidence corpus (as bench/key_codecs.py). --smoke: a lazy datastore of
the first 40 evidence documents (in a temporary directory), 1 dev fact per relation of the first 8 relations, the
radius 40, the codec SQ8, 2 questions timed, 4 fresh-facts documents.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from evidence import EVIDENCE, SMOKE, SMOKE_FACTS, SMOKE_FRESH, first_fresh, smoke_corpus
from key_codecs import lama_dev, p50_ms, p_at_1

FRESH = Path(__file__).resolve().parent / "fresh_facts"


def _fresh(reader, most: int | None = None) -> tuple[float, float, float, float]:
    """P@1 (%) of kNN and BERT-kNN on the fresh-facts questions with and without subjects, after adding their
    documents (the first `most`) to the reader's store."""
    docs = [json.loads(line) for line in (FRESH / "documents.jsonl").read_text(encoding="utf-8").splitlines()]
    questions = [json.loads(line) for line in (FRESH / "questions.jsonl").read_text(encoding="utf-8").splitlines()]
    docs, questions = first_fresh(docs, questions, most)
    reader.add_documents(docs)
    out = []
    for with_subject in (True, False):
        subjects = [q["subject"] if with_subject else None for q in questions]
        found = reader.predict_batch([q["question"] for q in questions], subjects, top_k=1, evidence=0)
        for ranked in ("knn", "bert_knn"):
            hits = [
                bool(getattr(p, ranked)) and getattr(p, ranked)[0].token == q["answer"]
                for p, q in zip(found, questions)
            ]
            out.append(100 * float(np.mean(hits)))
    return out[0], out[1], out[2], out[3]


def _bytes(path: Path, contexts: int) -> float:
    names = ("keys.f16", "keys.codes", "values.i32", "counts.i32", "store.sqlite")
    return sum((path / n).stat().st_size for n in names if (path / n).exists()) / contexts


def _row(name: str, radius: str, path: Path, encoder, dev, args, contexts: int, seconds: float) -> None:
    from bertknn.ingest.ingester import Writer
    from bertknn.query.pipeline import BertKNN
    from bertknn.store.datastore import Datastore

    store = Datastore(path)
    reader = BertKNN(encoder, store, writer=Writer(store, encoder))  # it adds the fresh facts' documents
    kept = reader.store.size
    subj, none = p_at_1(reader, dev, True), p_at_1(reader, dev, False)
    p50 = p50_ms(reader, dev[: args.timed])
    key_bytes = reader.store.keys_file()[1]
    per_context = _bytes(path, contexts)
    fresh = _fresh(reader, SMOKE_FRESH if args.smoke else None)
    reader.store.close()
    print(
        f"| {radius} | {name} | {kept:,} ({100 * kept / contexts:.1f}%) | {key_bytes * kept / contexts:.0f} | "
        f"{per_context:.0f} | {seconds:.1f} | {subj[0]:.1f} | {subj[1]:.1f} | {none[0]:.1f} | {none[1]:.1f} | "
        f"{fresh[1]:.1f} / {fresh[3]:.1f} | {p50:.1f} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--radii", default="none;20;40;80", help="squared-L2 merging radii, ';' apart")
    parser.add_argument("--codecs", default="", help="also measure each pruned store converted to these, ';' apart")
    parser.add_argument("--dev", type=int, default=5, help="dev facts per relation")
    parser.add_argument("--timed", type=int, default=60, help="questions timed one by one")
    parser.add_argument("--model", default="bertknn/minilm-l6-mlm")
    parser.add_argument("--corpus", type=Path, default=EVIDENCE, help="the corpus [default: the evidence corpus]")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    from bertknn.ingest.ingester import Writer
    from bertknn.ingest.prune import prune
    from bertknn.store.datastore import Datastore

    directory, most, threads = None, None, None
    if args.smoke:
        args.corpus, args.dev, args.radii, args.codecs, args.timed = smoke_corpus(), 1, "40", "SQ8", 2
        directory, most, threads = args.corpus.parent / "store", SMOKE_FACTS, 1
    encoder, dev, source = lama_dev(args.model, args.dev, args.corpus, directory, most, threads)
    src, contexts = source.store.path, source.store.size
    source.store.close()
    work = Path(tempfile.mkdtemp(prefix="prune_"))
    print(f"\n## Pruning: {contexts:,} contexts of {source.store.dim} dimensions, LAMA dev {len(dev)} facts\n")
    print(
        "| radius | keys | contexts kept | key bytes per context | bytes per context | prune s | kNN P@1 subj | "
        "BERT-kNN P@1 subj | kNN P@1 no subj | BERT-kNN P@1 no subj | fresh BERT-kNN subj / no subj | p50 ms |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for radius in (r.strip() for r in args.radii.split(";")):
        out, began = work / f"r{radius}", time.perf_counter()
        if radius == "none":
            shutil.copytree(src, out, ignore=shutil.ignore_patterns("write.lock"))
        else:
            prune(src, out, float(radius)).close()
        seconds = time.perf_counter() - began
        for codec in filter(None, (c.strip() for c in args.codecs.split(";"))):
            shutil.copytree(out, work / "coded", ignore=shutil.ignore_patterns("write.lock"))
            with Datastore(work / "coded") as coded:
                Writer(coded).convert_keys(codec)
            _row(codec, radius, work / "coded", encoder, dev, args, contexts, seconds)
            shutil.rmtree(work / "coded")
        _row("float16", radius, out, encoder, dev, args, contexts, seconds)
        shutil.rmtree(out)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
