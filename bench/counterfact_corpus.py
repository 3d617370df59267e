"""The old corpus that CounterFact's edits are measured against (reports/edits, docs/results/edits.md): the demo
corpus plus, for each of the first --n records of each half (dev: even case_id, test: odd), a document stating its
true fact ("{prompt} {ground_truth}.", titled by its subject), so that every edit meets an article it must outvote.

    python bench/counterfact_corpus.py --out counterfact_corpus.jsonl [--n 1000] [--smoke]
    bertknn build counterfact_corpus.jsonl --out counterfact_store
    bertknn eval edits counterfact_store $BERTKNN_DATA/counterfact/counterfact-train.json --split test --n 1000

--smoke: 5 records of each half, written to a temporary file.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from evidence import DATA, SMOKE

from bertknn.demo import DEMO_CORPUS
from bertknn.evaluation.edits_data import load_edits, split_edits

COUNTERFACT = DATA / "counterfact" / "counterfact-train.json"


def write_corpus(out: Path, n: int) -> int:
    """Write the corpus to `out`; return its number of documents."""
    records = load_edits(COUNTERFACT)
    chosen = split_edits(records, "dev", n) + split_edits(records, "test", n)
    docs = [json.loads(line) for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines()]
    docs += [{"id": f"true-{r.case_id}", "title": r.subject, "text": f"{r.prompt} {r.ground_truth}."} for r in chosen]
    out.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    return len(docs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("counterfact_corpus.jsonl"))
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"wrote {write_corpus(Path(tmp) / 'corpus.jsonl', 5):,} documents")
        return
    print(f"wrote {write_corpus(args.out, args.n):,} documents to {args.out}")


if __name__ == "__main__":
    main()
