"""The corpora that CounterFact's edits are measured against (reports/edits, docs/results/edits.md).

(a), the old corpus (the default): the demo corpus plus, for each of the first --n records of each half (dev: even
case_id, test: odd), a document stating its true fact ("{prompt} {ground_truth}.", titled by its subject), so that
every edit meets an article it must outvote.

(b), `--evidence SPLIT`: the documents of the evidence corpus titled by the subjects of the first --n records of
that half (titles compared as the title shortcut compares them, `text.normalize_title`): real articles, written
unlike the edits, that state most of the true facts among other things.

    python bench/counterfact_corpus.py --out counterfact_corpus.jsonl [--n 1000] [--evidence test] [--smoke]
    bertknn build counterfact_corpus.jsonl --out counterfact_store
    bertknn eval edits counterfact_store $BERTKNN_DATA/counterfact/counterfact-train.json --split test --n 1000

--smoke: 5 records of each half, written to a temporary file.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from evidence import DATA, EVIDENCE, SMOKE

from bertknn.demo import DEMO_CORPUS
from bertknn.evaluation.edits_data import load_edits, split_edits
from bertknn.text import normalize_title

COUNTERFACT = DATA / "counterfact" / "counterfact-train.json"


def old_corpus(n: int) -> list[str]:
    """(a): the demo corpus's lines and a true-fact document for each of the first `n` records of each half."""
    records = load_edits(COUNTERFACT)
    chosen = split_edits(records, "dev", n) + split_edits(records, "test", n)
    docs = [{"id": f"true-{r.case_id}", "title": r.subject, "text": f"{r.prompt} {r.ground_truth}."} for r in chosen]
    return DEMO_CORPUS.read_text(encoding="utf-8").splitlines() + [json.dumps(d) for d in docs]


def evidence_corpus(split: str, n: int) -> list[str]:
    """(b): the evidence corpus's lines whose title is the subject of one of the first `n` records of `split`."""
    subjects = {normalize_title(r.subject) for r in split_edits(load_edits(COUNTERFACT), split, n)}
    with EVIDENCE.open(encoding="utf-8") as lines:
        return [line.rstrip("\n") for line in lines if normalize_title(json.loads(line)["title"]) in subjects]


def write_corpus(out: Path, n: int, evidence: str | None = None) -> int:
    """Write the corpus to `out`; return its number of documents."""
    lines = evidence_corpus(evidence, n) if evidence else old_corpus(n)
    out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("counterfact_corpus.jsonl"))
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--evidence", choices=("dev", "test", "all"), help="(b): evidence documents of this half")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"wrote {write_corpus(Path(tmp) / 'corpus.jsonl', 5):,} documents")
            print(f"wrote {write_corpus(Path(tmp) / 'evidence.jsonl', 5, 'test'):,} evidence documents")
        return
    print(f"wrote {write_corpus(args.out, args.n, args.evidence):,} documents to {args.out}")


if __name__ == "__main__":
    main()
