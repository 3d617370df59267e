"""Where the benches find the evidence corpus, and the slice of it some of them build from."""

from __future__ import annotations

import os
from itertools import islice
from pathlib import Path

DATA = Path(os.environ.get("BERTKNN_DATA", Path(__file__).resolve().parents[1] / "../shared/data"))
EVIDENCE = DATA / "wiki" / "lama_evidence_docs.jsonl"


def first_documents(n: int, out: Path) -> Path:
    """Write the first `n` documents (lines) of the evidence corpus to `out`; return `out`."""
    with EVIDENCE.open(encoding="utf-8") as src, out.open("w", encoding="utf-8") as dst:
        dst.writelines(islice(src, n))
    return out
