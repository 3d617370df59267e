"""Query path: bertknn's BERT-kNN answer vs the reference path, same questions, same datastore, same process.

    python bench/query_path.py [--docs 12] [--questions 64] [--threads 2] [--rounds 5] [--profile] [--smoke]

Model: bert-base-shaped (12 blocks, 768 wide, random weights) with the real tokenizer; datastore: the first --docs
documents of the evidence corpus. Questions: LAMA T-REx template questions whose subject titles one of those
documents (so retrieval takes the title shortcut and kNN has candidates). Two datastores of those documents, built
with --pack 8 to save time (the query path's speed does not depend on how the keys were computed): the paper's
(targets of one wordpiece, as the reference answers) and bertknn's default one (whole words and names of several
wordpieces, evidence vectors), which the rows with bertknn's default settings read.
Reference path (as the authors' code does it): three copies of the model, two forward passes per batch (one for the
logits, one for the hidden states), and per question a new flat FAISS index built from float32 keys read from disk.
Batched, the reference runs batches of 32 questions as they come; bertknn's predict_batch runs them sorted by length in
batches of at most 1,024 padded tokens.
bertknn: one forward pass (head on the mask only), exact search on the float16 memmap, in PyTorch ("bertknn") and in
ONNX Runtime ("bertknn onnx", `--backend onnx`; its graph is exported into a temporary cache first, not timed) and
with questions in int8 ("bertknn onnx-int8", `--backend onnx-int8`: approximate; the top-1 agreement is printed).
These three answer with the paper's settings (`settings.PAPER`, as the reference does; their top-1 answers are
checked equal to the reference's); the "defaults" rows answer with bertknn's default settings (`settings.DEFAULT`:
whole words scored by the LM, sentence weights, the retrieval-aware vote, the log-linear mixture, calibrated) on the
default datastore, in PyTorch, ONNX and int8, and "no sentence weights" rows without the sentence weights (their
top-1 agreement with the paper's settings is printed, not checked). Prints single-question latency p50/p99,
batched questions/s, the share of IR + kNN + combine in bertknn's time (timed by replaying the model's outputs
computed beforehand), and the throughput ratios last. Threads (`Runtime.apply`): the reference and PyTorch paths give
PyTorch --threads; the ONNX paths give ONNX Runtime --threads and PyTorch one. --smoke: 2 documents, 4 questions,
1 round and a 2-block, 64-wide random BERT. --profile: each bertknn path's time per question by stage (`Stages`),
one question at a time and batched, and its model passes per question.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from unittest import mock

import faiss
import numpy as np
import torch
from evidence import SMOKE, SMOKE_BERT
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

from bertknn.evaluation.facts import load_lama
from bertknn.model.default_model import base_model_dir
from bertknn.model.encoder import Encoder
from bertknn.model.runtime import Runtime
from bertknn.query import pipeline
from bertknn.query import sentence_weights as query_sentences
from bertknn.query.combine import interpolate
from bertknn.query.knn import knn_distribution
from bertknn.query.pipeline import BertKNN
from bertknn.query.search import DocumentSearch
from bertknn.query.settings import DEFAULT, PAPER


def make_store(encoder: Encoder, docs: int, where: Path, paper: bool = True) -> BertKNN:
    data = Path(os.environ.get("BERTKNN_DATA", "../shared/data"))
    with (data / "wiki" / "lama_evidence_docs.jsonl").open(encoding="utf-8") as handle:
        rows = (json.loads(line) for line in handle)
        tdocs = [d for d, _ in zip((d for d in rows if d["source"].startswith("trex")), range(docs))]
    corpus = where / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in tdocs), encoding="utf-8")
    # keys' values do not matter for speed; the paper's targets (words of one wordpiece), as the reference answers,
    # or bertknn's defaults (whole words, evidence vectors)
    if paper:
        return BertKNN.build(corpus, where / "paper", encoder, pack=8, whole_words=False, evidence_vectors=False)
    return BertKNN.build(corpus, where / "defaults", encoder, pack=8)


PASSES = {"_mask_outputs": "LM passes", "_mean_states": "sentence passes"}  # `Encoder._run`'s forward: the kind


class Stages:
    """Where a path's time goes: each stage's function wrapped where the query path calls it (inclusive seconds),
    and the model passes (`Encoder._run` calls) by kind.
    "sentence vectors" runs inside "sentence weights", or in a thread of its own beside the LM's pass
    (`SentenceMatch.embed_ahead`); "other" is the total less the stages."""

    TIMED = (  # (stage, where its function lives, its name), the stages in the order the path runs them
        ("LM pass", Encoder, "query_ids"),
        ("search", DocumentSearch, "batch_search"),
        ("vote", pipeline, "vote"),
        ("word scores", pipeline, "scored"),
        ("sentence weights", query_sentences, "weights"),
        ("postprocess", BertKNN, "postprocess"),
    )

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.passes: Counter[str] = Counter()

    @contextlib.contextmanager
    def timing(self):
        """Time every stage while the context is open."""
        wrapped = [*self.TIMED, ("sentence vectors", Encoder, "sentence_vectors"), ("total", BertKNN, "predict_batch")]
        with contextlib.ExitStack() as stack:
            for stage, owner, name in wrapped:
                stack.enter_context(mock.patch.object(owner, name, self._timed(stage, getattr(owner, name))))
            stack.enter_context(mock.patch.object(Encoder, "_run", self._counted(Encoder._run)))
            yield self

    def _timed(self, stage: str, fn):
        def timed_call(*args, **kwargs):
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[stage] += time.perf_counter() - began

        return timed_call

    def _counted(self, run):
        def counted(encoder, forward, *args, **kwargs):
            self.passes[PASSES.get(forward.__name__, forward.__name__)] += 1
            return run(encoder, forward, *args, **kwargs)

        return counted

    def row(self, path: str, mode: str, questions: int) -> str:
        """A markdown row: ms per question by stage, then model passes per question."""
        per = {stage: 1000 * sec / questions for stage, sec in self.seconds.items()}
        staged = [per.get(stage, 0.0) for stage, *_ in self.TIMED]
        cells = [*staged, per.get("sentence vectors", 0.0), per["total"] - sum(staged), per["total"]]
        passes = [self.passes[kind] / questions for kind in PASSES.values()]
        return (
            f"| {path} | {mode} | "
            + " | ".join(f"{c:.1f}" for c in cells)
            + " | "
            + " | ".join(f"{p:.2f}" for p in passes)
            + " |"
        )


def profile(paths: dict[str, BertKNN], qs: list[str], subs: list[str], threads: int) -> None:
    """Each path's `Stages`, one question at a time and all questions batched (`--profile`)."""
    head = [stage for stage, *_ in Stages.TIMED] + [
        "sentence vectors",
        "other",
        "total",
        *PASSES.values(),
    ]
    print("\nms per question by stage (--profile):\n")
    print("| path | mode | " + " | ".join(head) + " |\n|" + " --- |" * (len(head) + 2))
    for name, knn in paths.items():
        Runtime.of(knn.encoder.runtime.backend, threads).apply()
        for mode in ("one", "batched"):
            knn.sentence_match.clear()  # no question's vectors cached from the run before
            with Stages().timing() as stages:
                if mode == "one":
                    for q, s in zip(qs, subs):
                        knn.predict(q, s)
                else:
                    knn.predict_batch(qs, subs)
            print(stages.row(name, mode, len(qs)))


class Reference:
    """The reference query path: 3 model copies, 2 forward passes per batch, a FAISS flat index per question."""

    def __init__(self, model, tokenizer, layer: int, knn: BertKNN) -> None:
        self.lm, self.hidden, self.third = model, copy.deepcopy(model), copy.deepcopy(model)
        self.tokenizer, self.layer, self.knn = tokenizer, layer, knn
        self.f32 = knn.store.path / "keys.f32"
        np.asarray(knn.store.keys, np.float32).tofile(self.f32)

    @torch.inference_mode()
    def answer(self, questions: list[str], subjects: list[str]) -> list[np.ndarray]:
        enc = self.tokenizer(
            [q.replace("[MASK]", self.tokenizer.mask_token) for q in questions], padding=True, return_tensors="pt"
        )
        logits = self.lm(**enc).logits
        states = self.hidden(**enc, output_hidden_states=True).hidden_states[self.layer]
        pos = (enc["input_ids"] == self.tokenizer.mask_token_id).nonzero()
        out = []
        dim = states.shape[-1]
        for (row, col), subject, q in zip(pos.tolist(), subjects, questions):
            p_bert = torch.softmax(logits[row, col], -1).numpy()
            docs = self.knn.search().documents(q, subject, PAPER.n_docs)
            ranges = self.knn.store.documents.ranges(docs)
            keys = (
                np.concatenate(
                    [
                        np.fromfile(self.f32, np.float32, (b - a) * dim, offset=a * dim * 4).reshape(-1, dim)
                        for a, b in ranges
                    ]
                )
                if ranges
                else np.zeros((0, dim), np.float32)
            )
            if len(keys):
                index = faiss.IndexFlatL2(dim)
                index.add(keys)
                dist, ids = index.search(states[row, col].numpy()[None], min(PAPER.k, len(keys)))
                values = np.concatenate([np.asarray(self.knn.store.values[a:b]) for a, b in ranges])[ids[0]]
                p = interpolate(p_bert, knn_distribution(values, dist[0], PAPER.temperature, len(p_bert)), PAPER.lam)
            else:
                p = p_bert
            out.append(p)
        return out


def replayed(knn: BertKNN, questions: list[str]) -> BertKNN:
    """`knn` with its encoder's outputs for `questions` computed beforehand: times everything but the forward."""
    encoded = [knn.encoder.question_ids(q) for q in questions]
    outputs = dict(zip(map(str, encoded), zip(*knn.encoder.query_ids(encoded))))
    encoder = copy.copy(knn.encoder)
    encoder.query_ids = lambda batch: tuple(np.stack(parts) for parts in zip(*(outputs[str(e)] for e in batch)))
    return BertKNN(encoder, knn.store, knn.index, knn.settings)


def timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=12)
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=5, help="alternating batched runs per path (the fastest counts)")
    parser.add_argument("--profile", action="store_true", help="each path's time by stage (`Stages`)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    shape = {}
    if args.smoke:
        args.docs, args.questions, args.rounds, args.threads, shape = 2, 4, 1, 1, SMOKE_BERT
    Runtime(threads=args.threads).apply()
    faiss.omp_set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir())
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=tokenizer.vocab_size, **shape)).eval()
    encoder = Encoder(model, tokenizer, "small-random" if args.smoke else "bert-base-shaped-random")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["BERTKNN_CACHE"] = str(Path(tmp) / "cache")  # the exported ONNX graph goes away with it
        built = make_store(encoder, args.docs, Path(tmp))  # the paper's datastore
        store, index = built.store, built.index
        onnx_encoder = Encoder(model, tokenizer, encoder.name, runtime="onnx")
        int8_encoder = Encoder(model, tokenizer, encoder.name, runtime="onnx-int8")
        knn = BertKNN(encoder, store, index, PAPER)  # the paper's settings, as the reference
        fast = BertKNN(onnx_encoder, store, index, PAPER)
        int8 = BertKNN(int8_encoder, store, index, PAPER)
        ours = make_store(encoder, args.docs, Path(tmp), paper=False)  # bertknn's default datastore
        unweighted = DEFAULT.replace(sentence_temperature=0.0)
        default = BertKNN(encoder, ours.store, ours.index, DEFAULT)
        fast_default = BertKNN(onnx_encoder, ours.store, ours.index, DEFAULT)
        int8_default = BertKNN(int8_encoder, ours.store, ours.index, DEFAULT)
        fast_unweighted = BertKNN(onnx_encoder, ours.store, ours.index, unweighted)
        int8_unweighted = BertKNN(int8_encoder, ours.store, ours.index, unweighted)
        titles = {t.lower() for t in knn.store.documents.titles(list(range(knn.store.n_documents)))}
        facts = [
            f
            for f in load_lama(
                Path(os.environ.get("BERTKNN_DATA", "../shared/data")) / "lama",
                tokenizer,
                ("T-REx",),
                warn=lambda m: None,
            )
            if f.subject.lower() in titles
        ]
        facts = (facts * (1 + args.questions // max(len(facts), 1)))[: args.questions]
        qs, subs = [f.question for f in facts], [f.subject for f in facts]
        ref = Reference(model, tokenizer, encoder.layer, knn)
        print(f"CPU: {os.cpu_count()} cores, torch capability {torch.backends.cpu.get_cpu_capability()}")
        print(f"{knn.store.size} contexts, {knn.store.n_documents} documents, {len(qs)} questions")
        for q, s in zip(qs[:4], subs[:4]):  # the paper's settings: the reference's answers (up to float16 keys)
            ours, onnx, theirs = knn.predict(q, s).p, fast.predict(q, s).p, ref.answer([q], [s])[0]
            assert np.argmax(ours) == np.argmax(theirs) == np.argmax(onnx), "the paper's settings left the reference"
            print(f"max |p onnx - p torch| {np.abs(onnx - ours).max():.1e}")
        answering = {"paper": knn, "onnx": fast, "onnx-int8": int8, "defaults": default}
        top = {name: [np.argmax(k.predict(q, s).p) for q, s in zip(qs, subs)] for name, k in answering.items()}
        agree = np.mean(np.equal(top["onnx-int8"], top["onnx"]))
        print(f"onnx-int8 vs onnx: the same BERT-kNN top-1 answer on {agree:.0%} of {len(qs)} questions")
        same = np.mean(np.equal(top["defaults"], top["paper"]))
        print(f"bertknn defaults vs the paper's settings: the same BERT-kNN top-1 on {same:.0%} of {len(qs)} questions")
        batches = [(qs[i : i + 32], subs[i : i + 32]) for i in range(0, len(qs), 32)]
        runs = {  # name: (one question, the batch, the thread policy: see Runtime.apply)
            "reference": (lambda q, s: ref.answer([q], [s]), lambda: [ref.answer(q, s) for q, s in batches], "torch"),
            "bertknn": (knn.predict, lambda: knn.predict_batch(qs, subs), "torch"),
            "bertknn onnx": (fast.predict, lambda: fast.predict_batch(qs, subs), "onnx"),
            "bertknn onnx-int8": (int8.predict, lambda: int8.predict_batch(qs, subs), "onnx-int8"),
            "bertknn defaults": (default.predict, lambda: default.predict_batch(qs, subs), "torch"),
            "bertknn onnx defaults": (fast_default.predict, lambda: fast_default.predict_batch(qs, subs), "onnx"),
            "bertknn onnx-int8 defaults": (
                int8_default.predict,
                lambda: int8_default.predict_batch(qs, subs),
                "onnx-int8",
            ),
            "bertknn onnx defaults, no sentence weights": (
                fast_unweighted.predict,
                lambda: fast_unweighted.predict_batch(qs, subs),
                "onnx",
            ),
            "bertknn onnx-int8 defaults, no sentence weights": (
                int8_unweighted.predict,
                lambda: int8_unweighted.predict_batch(qs, subs),
                "onnx-int8",
            ),
        }
        single, batched = {}, {name: [] for name in runs}
        for name, (one, _, backend) in runs.items():
            Runtime.of(backend, args.threads).apply()
            one(qs[0], subs[0])  # warm: sessions made, models loaded (the sentence encoder's too)
            single[name] = [timed(one, q, s) for q, s in zip(qs, subs)]
        for _ in range(args.rounds):  # alternating, so that a slow spell of the machine hits every path
            for name, (_, many, backend) in runs.items():
                Runtime.of(backend, args.threads).apply()
                batched[name].append(timed(many))
        timed_paths = (
            ("bertknn", knn),
            ("bertknn onnx", fast),
            ("bertknn onnx-int8", int8),
            ("bertknn defaults", default),
            ("bertknn onnx defaults", fast_default),
            ("bertknn onnx-int8 defaults", int8_default),
        )
        for name, knn_ in timed_paths:
            Runtime.of(knn_.encoder.runtime.backend, args.threads).apply()
            forward = [timed(knn_.encoder.query, [q]) for q in qs]
            forward_all = min(timed(knn_.encoder.query, qs) for _ in range(args.rounds))
            replay = replayed(knn_, qs)  # the same path with the model's outputs computed beforehand
            rest = [timed(replay.predict, q, s) for q, s in zip(qs, subs)]
            rest_all = min(timed(replay.predict_batch, qs, subs) for _ in range(args.rounds))
            print(
                f"{name}: forward p50 {np.median(forward) * 1000:.1f} ms; IR + kNN + combine p50 "
                f"{np.median(rest) * 1000:.1f} ms ({np.median(rest) / np.median(forward):.0%} of it); batched: "
                f"{rest_all / forward_all:.0%} of the forward time"
            )
        for name in single:
            p50, p99 = np.percentile(single[name], [50, 99]) * 1000
            rate = len(qs) / min(batched[name])
            print(f"{name}: single question p50 {p50:.1f} ms, p99 {p99:.1f} ms; batched {rate:.1f} questions/s")
        base = min(batched["reference"])
        ratios = [f"{name} {base / min(batched[name]):.2f}x" for name in batched if name != "reference"]
        print(f"query throughput ratio to the reference (batched): {', '.join(ratios)}")
        for backend in ("", " onnx", " onnx-int8"):
            paper_rate, default_rate = min(batched[f"bertknn{backend}"]), min(batched[f"bertknn{backend} defaults"])
            paper_p50, default_p50 = (np.median(single[f"bertknn{backend}{d}"]) for d in ("", " defaults"))
            print(
                f"bertknn{backend or ' (PyTorch)'} defaults / the paper's settings: batched time "
                f"{default_rate / paper_rate:.2f}x, single question p50 {default_p50 / paper_p50:.2f}x"
            )
        if args.profile:
            profile(
                {name: k for name, k in timed_paths} | {"bertknn onnx defaults, no sentence weights": fast_unweighted},
                qs,
                subs,
                args.threads,
            )


if __name__ == "__main__":
    main()
