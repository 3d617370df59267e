"""Where the benches find the evidence corpus, and the slice of it some of them build from; what their smoke forms
(`--smoke`, run by tests/test_benches.py) share."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from itertools import islice
from pathlib import Path

DATA = Path(os.environ.get("BERTKNN_DATA", Path(__file__).resolve().parents[1] / "../shared/data"))
EVIDENCE = DATA / "wiki" / "lama_evidence_docs.jsonl"
SMOKE = "every size at the least that still runs each step, the model on one thread (as tests/test_benches.py runs it)"
SMOKE_DOCS = 40  # documents of the evidence corpus a smoke form builds from, instead of the whole corpus
SMOKE_FACTS = 8  # LAMA facts a smoke form asks (1 per relation, of the first relations)
SMOKE_FRESH = 4  # documents of a fresh-facts set (bench/fresh_facts/) a smoke form adds, with their questions
# the random BERT of a smoke form (BertConfig's sizes): 2 blocks, 64 wide
SMOKE_BERT = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128}


def first_documents(n: int, out: Path) -> Path:
    """Write the first `n` documents (lines) of the evidence corpus to `out`; return `out`."""
    with EVIDENCE.open(encoding="utf-8") as src, out.open("w", encoding="utf-8") as dst:
        dst.writelines(islice(src, n))
    return out


def first_fresh(docs: list[dict], questions: list[dict], n: int | None) -> tuple[list[dict], list[dict]]:
    """The first `n` documents of a fresh-facts set (all for None) and the questions about them."""
    kept = docs[:n]
    ids = {d["id"] for d in kept}
    return kept, [q for q in questions if q["document"] in ids]


def scratch() -> Path:
    """A new temporary directory, removed when the process exits."""
    path = Path(tempfile.mkdtemp(prefix="bench_"))
    atexit.register(shutil.rmtree, path, True)
    return path


def smoke_corpus(n: int = SMOKE_DOCS) -> Path:
    """The first `n` documents of the evidence corpus in a temporary file (removed at exit): what a smoke form reads
    instead of the whole corpus."""
    return first_documents(n, scratch() / "evidence_head.jsonl")


def lama_dev(args):
    """(encoder, reader, facts) of a LAMA dev run: the model `args.model` in ONNX Runtime, `tune.DevSplit`'s
    `args.lama_dev` facts per T-REx and Google-RE relation, and the lazy datastore of `args.corpus` they are asked
    over (a smoke form: its first SMOKE_FACTS facts, the store beside its corpus)."""
    from bertknn.evaluation.facts import GROUPS, load_lama
    from bertknn.evaluation.run import lama_reader
    from bertknn.evaluation.tune import DevSplit
    from bertknn.model.encoder import Encoder

    encoder = Encoder.load(args.model, runtime="onnx")
    facts = load_lama(DATA / "lama", encoder.tokenizer, GROUPS, warn=lambda m: None)
    dev = DevSplit(per_relation=args.lama_dev, squad=0).choose(facts)
    directory = None
    if args.smoke:
        dev, directory = dev[:SMOKE_FACTS], args.corpus.parent / "store"
    return encoder, lama_reader(args.corpus, encoder, directory), dev
