"""Compressed keys, measured: bytes per key, LAMA P@1 and question time when the exact search reads each form's
codes (`store/codec.py`) instead of the float16 keys.

    python bench/key_codecs.py [--dev 5] [--forms "float16;SQ8;SQ4;PCA96,SQ8;PQ96;PQ48"] [--train 50000] [--corpus F]
    python bench/key_codecs.py --exact-search [--forms ...]    # only the exact search's time per form
    python bench/key_codecs.py --smoke [--exact-search]

Store: the lazy datastore of the evidence corpus that `eval lama` uses (cached; the offline default model, keys of
384 dimensions). Questions: `tune.DevSplit` (--dev facts per T-REx and Google-RE relation, seed 1), asked with and
without subjects through `predict_batch` with bertknn's defaults (IR retrieval). A first float16 pass embeds every
document the questions retrieve; then, per form, a codec is trained on --train keys drawn at random (seed 0), every
key of the store is encoded, and the exact search decodes the candidates' codes (`codec.Decoded` in place of the
float16 memmap). Printed per form: code bytes per key and their ratio to float16, training and encoding seconds, the
mean relative reconstruction error, P@1 of kNN and BERT-kNN with and without subjects, and the p50 of one question
(`predict`, with subject, --timed questions, warm). --corpus: another corpus than the evidence corpus (its lazy
datastore cached as `eval lama` caches one). --smoke: a lazy datastore of the first 40 evidence documents (in a
temporary directory), 1 dev fact per relation of the first 8 relations, the forms float16 and SQ8, 1,000 training
keys, 2 questions timed.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from evidence import DATA, EVIDENCE, SMOKE, SMOKE_FACTS, smoke_corpus


def p_at_1(reader, facts, with_subject: bool) -> tuple[float, float]:
    """P@1 (%) of the kNN ranking and of BERT-kNN's over `facts`."""
    from bertknn.evaluation.facts import ir_subject

    subjects = [ir_subject(f) if with_subject else None for f in facts]
    found = reader.predict_batch([f.question for f in facts], subjects, top_k=1, evidence=0, batch_size=32)
    knn = np.mean([bool(p.knn) and p.knn[0].id == f.answer_id for p, f in zip(found, facts)])
    both = np.mean([bool(p.bert_knn) and p.bert_knn[0].id == f.answer_id for p, f in zip(found, facts)])
    return 100 * knn, 100 * both


def p50_ms(reader, facts) -> float:
    from bertknn.evaluation.facts import ir_subject

    times = []
    for f in facts:
        began = time.perf_counter()
        reader.predict(f.question, subject=ir_subject(f), top_k=1, evidence=0)
        times.append(time.perf_counter() - began)
    return 1000 * float(np.median(times))


def _encoded(codec, keys, chunk: int = 1 << 16) -> np.ndarray:
    return np.concatenate(
        [codec.encode(np.asarray(keys[a : a + chunk], np.float32)) for a in range(0, len(keys), chunk)]
    )


def _error(codec, keys, rows: np.ndarray) -> float:
    """Mean |decode(encode(k)) - k| / |k| over `rows`."""
    sample = np.asarray(keys[rows], np.float32)
    back = codec.decode(codec.encode(sample))
    return float(np.mean(np.linalg.norm(back - sample, axis=1) / np.linalg.norm(sample, axis=1)))


def lama_dev(
    model: str,
    per_relation: int,
    corpus: Path = EVIDENCE,
    directory: Path | None = None,
    most: int | None = None,
    threads: int | None = None,
):
    """(encoder, LAMA dev facts (the first `most` of them), reader over the lazy datastore of `corpus`: the evidence
    corpus's unless told, in `directory`, else cached), every document the facts retrieve with and without subjects
    embedded; the model on `threads` threads (None: every core)."""
    from bertknn.evaluation.facts import GROUPS, load_lama
    from bertknn.evaluation.run import lama_reader
    from bertknn.evaluation.tune import DevSplit
    from bertknn.model.encoder import Encoder
    from bertknn.model.runtime import Runtime

    Runtime(threads=threads or os.cpu_count() or 1).apply()
    encoder = Encoder.load(model, runtime="onnx")
    facts = load_lama(DATA / "lama", encoder.tokenizer, GROUPS, warn=lambda m: None)
    dev = DevSplit(per_relation=per_relation, squad=0).choose([f for f in facts if f.group in ("T-REx", "Google-RE")])
    dev = dev[:most]
    reader = lama_reader(corpus, encoder, directory)
    for with_subject in (True, False):  # embeds what the questions retrieve, once
        p_at_1(reader, dev, with_subject)
    return encoder, dev, reader


def exact_search_times(reader, facts, args) -> None:
    """Per form, the exact search over the candidates of each question (its IR documents' entries, with subject):
    on the float16 memmap, on the codes (`Decoded.distances`: FAISS's distances over the codes, or decoding for a
    codec with a transform) and by decoding the rows first; mean ms per question (3 passes), interleaved in one
    process."""
    from bertknn.evaluation.facts import ir_subject
    from bertknn.index.exact import candidates
    from bertknn.store.codec import Decoded, KeyCodec

    store, search = reader.store, reader.search("ir")
    queries = reader.preprocess([f.question for f in facts], [ir_subject(f) for f in facts])
    _, states = reader.encoder.query_ids([(q.ids, q.mask) for q in queries])
    # the documents as the paper's retrieval chose them (no entity filter): the timing wants candidates for every
    # question, and the smoke corpus names few subjects
    rows = [candidates(store.documents.ranges(search.documents(q.text, q.subject, 3, named=False))) for q in queries]
    rows, states = [r for r in rows if len(r)], [s for r, s in zip(rows, states) if len(r)]
    union = np.unique(np.concatenate(rows))
    drawn = np.random.default_rng(0).choice(store.size, min(args.train, store.size), replace=False)
    sample = np.asarray(store.keys[np.sort(drawn)])
    print(f"\n## Exact search: {len(rows)} questions, {np.mean([len(r) for r in rows]):,.0f} candidates each\n")
    print("| form | float16 ms | on the codes ms | decoded first ms | codes vs decoded |\n|---|---:|---:|---:|---:|")
    for form in (f.strip() for f in args.forms.split(";") if f.strip() != "float16"):
        codec = KeyCodec.train(form, np.asarray(sample, np.float32))
        codes = np.zeros((store.size, codec.code_size), np.uint8)
        codes[union] = codec.encode(np.asarray(store.keys[union], np.float32))
        coded = Decoded(codec, codes)
        ways = {
            "float16": lambda r, s: _l2(np.asarray(store.keys[r], np.float32), s),
            "codes": lambda r, s, c=coded: c.distances(r, s),
            "decoded": lambda r, s, c=coded: _l2(c[r], s),
        }
        spent: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(3):
            for r, s in zip(rows, states):
                for name, way in ways.items():
                    began = time.perf_counter()
                    way(r, s)
                    spent[name].append(1000 * (time.perf_counter() - began))
        ms = {name: float(np.mean(t)) for name, t in spent.items()}  # the mean: a few large candidate sets cost most
        print(
            f"| {form} | {ms['float16']:.2f} | {ms['codes']:.2f} | {ms['decoded']:.2f} | "
            f"{ms['decoded'] / ms['codes']:.1f}x |",
            flush=True,
        )


def _l2(rows: np.ndarray, query: np.ndarray) -> np.ndarray:
    diff = rows - query
    return np.einsum("ij,ij->i", diff, diff)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dev", type=int, default=5, help="dev facts per relation")
    parser.add_argument(
        "--forms", default="float16;SQ8;SQ4;PCA96,SQ8;PQ96;PQ48", help="FAISS factory strings, ';' apart"
    )
    parser.add_argument("--train", type=int, default=50_000, help="keys a codec is trained on")
    parser.add_argument("--timed", type=int, default=60, help="questions timed one by one")
    parser.add_argument("--model", default="bertknn/minilm-l6-mlm")
    parser.add_argument(
        "--exact-search", action="store_true", help="only time the exact search on each form (codes vs decoding)"
    )
    parser.add_argument("--corpus", type=Path, default=EVIDENCE, help="the corpus [default: the evidence corpus]")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    from bertknn.store.codec import Decoded, KeyCodec

    directory, most, threads = None, None, None
    if args.smoke:
        args.corpus, args.dev, args.forms, args.train, args.timed = smoke_corpus(), 1, "float16;SQ8", 1000, 2
        directory, most, threads = args.corpus.parent / "store", SMOKE_FACTS, 1
    _, dev, reader = lama_dev(args.model, args.dev, args.corpus, directory, most, threads)
    store = reader.store
    if args.exact_search:
        exact_search_times(reader, dev, args)
        return
    keys, dim = store.keys, store.dim
    rng = np.random.default_rng(0)
    sample_rows = np.sort(rng.choice(store.size, min(args.train, store.size), replace=False))
    check_rows = np.sort(rng.choice(store.size, min(5000, store.size), replace=False))
    print(f"\n## Key codecs: {store.size:,} keys of {dim} dimensions, LAMA dev {len(dev)} facts\n")
    print(
        "| form | bytes/key | of float16 | train s | encode s | rel. error | kNN P@1 subj | BERT-kNN P@1 subj "
        "| kNN P@1 no subj | BERT-kNN P@1 no subj | question p50 ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for form in (f.strip() for f in args.forms.split(";")):
        if form == "float16":
            store.keys, size, train_s, encode_s, error = keys, 2 * dim, 0.0, 0.0, 0.0
        else:
            began = time.perf_counter()
            codec = KeyCodec.train(form, np.asarray(keys[sample_rows], np.float32))
            train_s, began = time.perf_counter() - began, time.perf_counter()
            codes = _encoded(codec, keys)
            encode_s, size, error = time.perf_counter() - began, codec.code_size, _error(codec, keys, check_rows)
            store.keys = Decoded(codec, codes)
        subj, none = p_at_1(reader, dev, True), p_at_1(reader, dev, False)
        p50 = p50_ms(reader, dev[: args.timed])
        print(
            f"| {form} | {size} | 1/{2 * dim / size:.0f} | {train_s:.1f} | {encode_s:.1f} | {error:.3f} | "
            f"{subj[0]:.1f} | {subj[1]:.1f} | {none[0]:.1f} | {none[1]:.1f} | {p50:.1f} |",
            flush=True,
        )
    store.keys = keys


if __name__ == "__main__":
    main()
