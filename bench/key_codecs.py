"""Compressed keys, measured before they become a datastore option: bytes per key, LAMA P@1 and question time when
the exact search reads each form's codes (`store/codec.py`) instead of the float16 keys.

    python bench/key_codecs.py [--dev 5] [--forms "float16;SQ8;SQ4;PCA96,SQ8;PQ96;PQ48"] [--train 50000]

Store: the lazy datastore of the evidence corpus that `eval lama` uses (cached; the offline default model, keys of
384 dimensions). Questions: `tune.DevSplit` (--dev facts per T-REx and Google-RE relation, seed 1), asked with and
without subjects through `predict_batch` with bertknn's defaults (IR retrieval). A first float16 pass embeds every
document the questions retrieve; then, per form, a codec is trained on --train keys drawn at random (seed 0), every
key of the store is encoded, and the exact search decodes the candidates' codes (`codec.Decoded` in place of the
float16 memmap). Printed per form: code bytes per key and their ratio to float16, training and encoding seconds, the
mean relative reconstruction error, P@1 of kNN and BERT-kNN with and without subjects, and the p50 of one question
(`predict`, with subject, --timed questions, warm).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from evidence import DATA, EVIDENCE


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dev", type=int, default=5, help="dev facts per relation")
    parser.add_argument(
        "--forms", default="float16;SQ8;SQ4;PCA96,SQ8;PQ96;PQ48", help="FAISS factory strings, ';' apart"
    )
    parser.add_argument("--train", type=int, default=50_000, help="keys a codec is trained on")
    parser.add_argument("--timed", type=int, default=60, help="questions timed one by one")
    parser.add_argument("--model", default="bertknn/minilm-l6-mlm")
    args = parser.parse_args()
    from bertknn.evaluation.facts import GROUPS, load_lama
    from bertknn.evaluation.run import lama_reader
    from bertknn.evaluation.tune import DevSplit
    from bertknn.model.encoder import Encoder
    from bertknn.model.runtime import Runtime
    from bertknn.store.codec import Decoded, KeyCodec

    Runtime(threads=os.cpu_count() or 1).apply()
    encoder = Encoder.load(args.model, runtime="onnx")
    facts = load_lama(DATA / "lama", encoder.tokenizer, GROUPS, warn=lambda m: None)
    dev = DevSplit(per_relation=args.dev, squad=0).choose([f for f in facts if f.group in ("T-REx", "Google-RE")])
    reader = lama_reader(EVIDENCE, encoder)
    for with_subject in (True, False):  # embeds what the questions retrieve, once
        p_at_1(reader, dev, with_subject)
    store = reader.store
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
