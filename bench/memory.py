"""Datastore memory: bytes per stored context at 768 dimensions, and peak RSS of builds of growing corpora.

    python bench/memory.py [--docs 8] [--scale 1,8,64] [--smoke]

Bytes per context: a bert-base-shaped model (random weights) builds a datastore of the first --docs documents of the
evidence corpus (with --pack 8 to save time: sizes do not depend on the keys' values); the keys (float16), values
(int32) and SQLite provenance are divided by the number of entries (the
reference stored 3,076 bytes of fp32 .fvecs per context, plus a SQLite row). Streaming: a 2-block, 64-wide model
builds corpora of --docs x each --scale documents in fresh processes; the last line prints the ratio of peak RSS of
the largest to the smallest build (1.0 means memory does not grow with the corpus). --smoke: 2 documents, scale 1
only, the 768-wide model with 2 blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from evidence import SMOKE

CHILD = """
import json, resource, sys, torch
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM
from bertknn.model.default_model import base_model_dir
from bertknn.model.encoder import Encoder
from bertknn.query.pipeline import BertKNN
torch.set_num_threads(1)
tok = AutoTokenizer.from_pretrained(base_model_dir())
dims = dict(json.loads(sys.argv[3]))
torch.manual_seed(0)
enc = Encoder(BertForMaskedLM(BertConfig(vocab_size=tok.vocab_size, **dims)).eval(), tok, "random")
store = BertKNN.build(sys.argv[1], sys.argv[2], enc, pack=int(sys.argv[4])).store  # with its IR index
print(json.dumps({"entries": store.size, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""
BASE = {}
SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128}


def corpus(path: Path, docs: int, copies: int) -> Path:
    """The first `docs` evidence documents, repeated `copies` times under new ids."""
    data = Path(os.environ.get("BERTKNN_DATA", "../shared/data")) / "wiki" / "lama_evidence_docs.jsonl"
    with data.open(encoding="utf-8") as handle:
        first = [json.loads(line) for line, _ in zip(handle, range(docs))]
    with path.open("w", encoding="utf-8") as out:
        for c in range(copies):
            for d in first:
                out.write(json.dumps(dict(d, id=f"{d['id']}#{c}")) + "\n")
    return path


def build(corpus_path: Path, out: Path, dims: dict, pack: int = 1) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(corpus_path), str(out), json.dumps(dims), str(pack)],
        capture_output=True,
        text=True,
    )
    if result.returncode:
        sys.exit(f"the build of {corpus_path} in a child process failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--scale", default="1,8,64")
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    base = BASE
    if args.smoke:
        args.docs, args.scale, base = 2, "1", {"num_hidden_layers": 2}  # 768 wide still: the bytes per context
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        stats = build(corpus(tmp / "c.jsonl", args.docs, 1), tmp / "base", base, pack=8)
        n = stats["entries"]
        sizes = {p.name: p.stat().st_size for p in (tmp / "base").iterdir()}
        kv = sizes["keys.f16"] + sizes["values.i32"]
        print(
            f"{n} contexts at 768 dimensions: keys+values {kv / n:.0f} bytes/context; "
            f"SQLite {sizes['store.sqlite'] / n:.0f} bytes/context (documents, sentence texts, spans); "
            f"whole directory {sum(sizes.values()) / n:.0f} bytes/context (reference: 3,076 + a SQLite row)"
        )
        peaks = {}
        for scale in (int(s) for s in args.scale.split(",")):
            stats = build(corpus(tmp / f"c{scale}.jsonl", args.docs, scale), tmp / f"s{scale}", SMALL)
            peaks[scale] = stats["peak_rss"]
            disk = sum(f.stat().st_size for f in (tmp / f"s{scale}").iterdir())
            print(
                f"corpus x{scale}: {stats['entries']} contexts, datastore {disk / 2**20:.0f} MiB on disk, "
                f"peak RSS {stats['peak_rss'] / 2**20:.0f} MiB"
            )
        lo, hi = min(peaks), max(peaks)
        print(f"peak RSS ratio x{hi}/x{lo}: {peaks[hi] / peaks[lo]:.2f}")


if __name__ == "__main__":
    main()
