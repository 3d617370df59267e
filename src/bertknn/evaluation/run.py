"""The LAMA runner: facts through a `BertKNN` (the reader) a batch at a time, each fact's ranks under BERT, kNN,
BERT-kNN and the frequency baseline appended to its results file (resumable); the cached lazy datastore `eval lama`
and `tune` read with (`lama_reader`); and the layer comparison that drives `eval lama` (`evaluate_layers`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np

from bertknn.evaluation.facts import Fact, fact_key, ir_subject, subject_has_answer, uhn_string_match, vocab_ids
from bertknn.evaluation.metrics import rank_of, summarize
from bertknn.evaluation.results import read_results, results_name


def _top3(ranked_list) -> list[list]:
    return [[t.token, round(t.probability, 4)] for t in ranked_list[:3]]


def _embed_batch(reader, queries: list, embedded: int, report: Callable[[str, int, int], None]) -> int:
    """Embed the documents of a batch's questions first, in a lazy datastore, in view (`report("embedding", ...)`:
    one bar over the run, which had embedded `embedded` documents before); the run's documents embedded after it."""
    if not reader.store.manifest.lazy:
        return embedded

    def shown(done: int, total: int) -> None:
        report("embedding", embedded + done, embedded + total)

    return embedded + reader.embed_retrieved(queries, reader.settings.n_docs, shown)[1]


def _result_row(reader, fact: Fact, pred, vocab: np.ndarray | None) -> dict:
    """A fact's line of its results file: the gold token's rank under each method and the frequency baseline (the
    words stored for the searched documents, counted), the top-3 answers, the ceiling and the baselines' flags."""
    size = reader.encoder.vocab_size  # LAMA's protocol: answers of one token, ranked over the vocabulary
    values = np.asarray(reader.store.values[pred.neighbours.searched])  # the frequency baseline's words
    values = values[values < size]
    counts = np.bincount(values, minlength=size).astype(np.float64) if len(values) else None
    return {
        "key": fact_key(fact),
        "group": fact.group,
        "relation": fact.relation,
        "subject": fact.subject,
        "answer": fact.answer,
        "question": fact.question,
        "documents": pred.documents,
        "ranks": {
            "bert": rank_of(pred.p_bert, fact.answer_id, vocab, size),
            "knn": rank_of(pred.p_knn, fact.answer_id, vocab, size),
            "bert_knn": rank_of(pred.p, fact.answer_id, vocab, size),
            "frequency": rank_of(counts, fact.answer_id, vocab, size),
        },
        "top3": {"bert": _top3(pred.bert), "knn": _top3(pred.knn), "bert_knn": _top3(pred.bert_knn)},
        "ceiling": bool(len(values)) and bool(np.any(values == fact.answer_id)),
        "subject_token": subject_has_answer(fact, reader.encoder.tokenizer),
        "uhn_string_match": uhn_string_match(fact),
    }


def evaluate_facts(
    reader,
    facts: list[Fact],
    results_path: str | Path,
    vocab: np.ndarray | None = None,
    batch_size: int = 32,
    progress=None,
    max_seconds: float | None = None,
    seed: int = 0,
    with_subject: bool = True,
) -> list[dict]:
    """Rank every fact's gold token under BERT, kNN, BERT-kNN and the frequency baseline; resumable. Without
    `with_subject` no question gets its subject: documents are retrieved from the question's own text, as a user
    asks.

    Facts are taken in a seeded random order, a batch at a time: the batch's documents are embedded (in a lazy
    datastore; `progress` reports "embedding" then, counting documents), then its results are appended to
    `results_path` (JSON lines). A rerun skips the facts already there,
    and a run stopped early (a kill, or `max_seconds` spent) holds a random subsample of the facts. Returns the
    results of the facts done, in the order of `facts`.
    """
    results_path = Path(results_path)
    done = read_results(results_path) if results_path.exists() else {}
    todo = [f for f in facts if fact_key(f) not in done]
    todo = random.Random(seed).sample(todo, len(todo))
    report = progress or (lambda phase, n, total: None)
    deadline = time.time() + max_seconds if max_seconds else None
    report("facts", len(facts) - len(todo), len(facts))
    embedded = 0  # documents of a lazy datastore this run has embedded
    with results_path.open("a", encoding="utf-8") as out:
        for start in range(0, len(todo), batch_size):
            if deadline and time.time() >= deadline:
                break
            batch = todo[start : start + batch_size]
            subjects = [ir_subject(f) if with_subject else None for f in batch]
            queries = reader.preprocess([f.question for f in batch], subjects)
            embedded = _embed_batch(reader, queries, embedded, report)
            preds = reader.predict_batch(queries, top_k=3, evidence=0)
            for fact, pred in zip(batch, preds):
                row = _result_row(reader, fact, pred, vocab)
                out.write(json.dumps(row) + "\n")
                done[row["key"]] = row
            out.flush()
            report("facts", len(facts) - len(todo) + min(start + batch_size, len(todo)), len(facts))
    return [done[fact_key(f)] for f in facts if fact_key(f) in done]


def lama_reader(
    corpus: str | Path,
    encoder,
    directory: str | Path | None = None,
    progress=None,
    pack: int = 1,
    int8_keys: bool = False,
    **hparams,
):
    """A BertKNN over a lazy datastore of `corpus` (a path in any format `bertknn build` reads) for this model,
    layer, pack and key precision, cached.

    `hparams`: BertKNN's settings (n_docs, k, temperature, lam, ...; None = the datastore's tuned value, else
    bertknn's default).

    A new one starts from the registered documents and IR index of a cached datastore of the same corpus (another
    model or layer), since those do not depend on the model.
    """
    from bertknn.ingest.builder import copy_registration
    from bertknn.ingest.corpus import open_corpus
    from bertknn.model.encoder import cache_dir
    from bertknn.query.pipeline import BertKNN
    from bertknn.store.datastore import Datastore
    from bertknn.store.manifest import VERSION

    stem = f"lazy-{Path(corpus).stem}-{hashlib.sha256(str(Path(corpus).resolve()).encode()).hexdigest()[:10]}"
    if directory is None:
        dtype = encoder.runtime.dtype
        suffix = (
            (f"-pack{pack}" if pack > 1 else "") + ("-int8" if int8_keys else "") + f"-{dtype}" * (dtype != "float32")
        )
        directory = cache_dir() / f"{stem}-{encoder.cache_tag}{suffix}-v{VERSION}"  # a new format: a new datastore
    if not Path(directory).exists():
        sha = open_corpus(corpus).fingerprint()  # any format `bertknn build` reads
        for other in sorted(cache_dir().glob(f"{stem}-*")):
            with contextlib.suppress(Exception):  # any unusable candidate is simply not a source
                known = Datastore(other).manifest.get("corpus") or {}
                if known.get("sha256") == sha and Datastore(other).n_documents == known.get("documents"):
                    copy_registration(other, directory, encoder, pack, int8_keys)
                    break
    return BertKNN.build(
        corpus, directory, encoder, lazy=True, pack=pack, int8_keys=int8_keys, progress=progress, **hparams
    )


def evaluate_layers(
    corpus: str | Path,
    encoder,
    facts: list[Fact],
    out: str | Path,
    layers: list[int] | None = None,
    common: set[str] | None = None,
    phases: Callable[[], AbstractContextManager] = contextlib.nullcontext,
    max_seconds: float | None = None,
    seed: int = 0,
    pack: int = 1,
    int8_keys: bool = False,
    with_subject: bool = True,
    **hparams,
) -> tuple[dict, list[dict], Any]:
    """Evaluate `facts` with keys from each of `layers` (default: the encoder's), results resumed in `out`, so that
    layers can be compared (the paper's Table 3). `phases()` gives each layer's run its progress `report`.

    Returns the main layer's (the encoder's if among them, else the first) summary, rows and BertKNN; the summary's
    "layers" holds every layer's LAMA metrics when there are several.
    """
    Path(out).mkdir(parents=True, exist_ok=True)
    vocab = vocab_ids(common, encoder.tokenizer)
    runs = {}
    for layer in layers or [encoder.layer]:
        enc = encoder.at_layer(layer)
        with phases() as report:
            reader = lama_reader(corpus, enc, progress=report, pack=pack, int8_keys=int8_keys, **hparams)
            name = results_name(reader, "full" if common is None else "common", with_subject)
            options = {"progress": report, "max_seconds": max_seconds, "seed": seed, "with_subject": with_subject}
            rows = evaluate_facts(reader, facts, Path(out) / name, vocab, **options)
        runs[layer] = (summarize(rows), rows, reader)
    main = encoder.layer if encoder.layer in runs else next(iter(runs))
    summary, rows, reader = runs[main]
    if len(runs) > 1:
        summary["layers"] = {str(layer): run[0]["sets"].get("LAMA", {}).get("metrics") for layer, run in runs.items()}
    return summary, rows, reader
