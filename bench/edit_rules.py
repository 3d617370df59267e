"""The rule that tells an article's versions apart (`knn.version_weights`), measured: how strongly a newer document
outvotes an older one (e^NEWER) and how near its evidence must be (within `margin` temperatures of the older one's),
against two things an update must do: win where it restates the asked fact (efficacy) and leave the old answer where
it says something else (retention).

    python bench/edit_rules.py [--n 200] [--newer 4.6,10,20] [--margins 1,3] [--smoke]

The datastore: the demo corpus plus, for each of the first --n CounterFact records of the dev half (even case_id), a
document stating its true fact ("{prompt} {ground_truth}."), titled by its subject (the old corpus of
reports/edits). Efficacy: each record's edit added ("{prompt} {target_new}.", same title), the prompt asked with the
subject; right when the top-1 word is the new target. Retention: instead, a newer document about the subject that
states no fact of the relation ("{subject} was in the news in 2020. A new book about {subject} appeared."); right when
the top-1 word is still the true one (the share right before it was added is printed beside). bertknn's default
settings otherwise; the default model. --smoke: 5 records, one rule.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from evidence import DATA, SMOKE

import bertknn.query.knn as knn_module
import bertknn.query.pipeline as pipeline_module
from bertknn.demo import DEMO_CORPUS
from bertknn.evaluation.edits_data import load_edits, split_edits
from bertknn.ingest.ingester import Writer
from bertknn.query.pipeline import BertKNN
from bertknn.store.datastore import Datastore

COUNTERFACT = DATA / "counterfact" / "counterfact-train.json"
OUTRANKED = knn_module.outranked


def _rule(newer: float, margin: float) -> None:
    """Set the rule's two constants for the next questions (module constants of the method, not settings)."""
    pipeline_module.NEWER = newer
    knn_module.outranked = lambda owners, dist, docs, temperature: OUTRANKED(owners, dist, docs, temperature * margin)


def _top1(reader: BertKNN, records: list) -> list[str]:
    found = reader.predict_batch([f"{r.prompt} [MASK] ." for r in records], [r.subject for r in records], top_k=1)
    return [p.bert_knn[0].token if p.bert_knn else "" for p in found]


def _share(answers: list[str], words: list[str]) -> float:
    return 100.0 * sum(a == w.lower() for a, w in zip(answers, words)) / len(words)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--newer", default="4.6,10,20")
    parser.add_argument("--margins", default="1,3")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    n, newer, margins = args.n, [float(x) for x in args.newer.split(",")], [float(x) for x in args.margins.split(",")]
    if args.smoke:
        n, newer, margins = 5, [20.0], [1.0]
    records = split_edits(load_edits(COUNTERFACT), "dev", n)
    docs = [json.loads(line) for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines()]
    docs += [{"id": f"true-{r.case_id}", "title": r.subject, "text": f"{r.prompt} {r.ground_truth}."} for r in records]
    edits = [{"id": f"edit-{r.case_id}", "title": r.subject, "text": f"{r.prompt} {r.target_new}."} for r in records]
    news = [
        {
            "id": f"news-{r.case_id}",
            "title": r.subject,
            "text": f"{r.subject} was in the news in 2020. A new book about {r.subject} appeared.",
        }
        for r in records
    ]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        corpus.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
        base = BertKNN.build(corpus, Path(tmp) / "base")
        before = _share(_top1(base, records), [r.ground_truth for r in records])
        print(f"{len(records)} CounterFact dev records; true answer top-1 before any update: {before:.1f}%")
        print("| rule | efficacy (edit wins) | retention (unrelated update leaves the old answer) |")
        print("| --- | --- | --- |")
        for value in newer:
            for margin in margins:
                _rule(value, margin)
                shares = []
                for added, gold in ((edits, "target_new"), (news, "ground_truth")):
                    path = Path(tmp) / "trial"
                    shutil.rmtree(path, ignore_errors=True)
                    shutil.copytree(base.store.path, path)
                    store = Datastore(path)
                    reader = BertKNN(base.encoder, store, writer=Writer(store, base.encoder))
                    reader.add_documents(added)
                    shares.append(_share(_top1(reader, records), [getattr(r, gold) for r in records]))
                    reader.store.close()
                print(f"| newest, e^{value:g}, margin {margin:g} T | {shares[0]:.1f} | {shares[1]:.1f} |")
    _rule(pipeline_module.NEWER, 1.0)


if __name__ == "__main__":
    main()
