"""Sentence splitters on the evidence corpus: sentences/s on one core and agreement with pysbd (the reference).

    python bench/splitters.py [--docs 2000] [--smoke]    # all four need: pip install blingfire syntok sentencex

Each splitter reads the same passages of the first --docs documents of $BERTKNN_DATA/wiki/lama_evidence_docs.jsonl
(via `iter_corpus`), one process, one thread. Agreement: the sentence boundaries (character offsets in the passage,
whitespace ignored) a splitter shares with pysbd, as precision / recall / F1 against pysbd's, and the share of
passages split exactly as pysbd splits them. A splitter whose package is not installed is left out (named first).
--smoke: the first 5 documents.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

from evidence import SMOKE

from bertknn.text import iter_corpus, split_sentences


def _blingfire() -> Callable[[str], list[str]]:
    import blingfire

    return lambda text: blingfire.text_to_sentences(text).split("\n")


def _syntok() -> Callable[[str], list[str]]:
    from syntok import segmenter

    return lambda text: ["".join(t.spacing + t.value for t in s).strip() for p in segmenter.process(text) for s in p]


def _sentencex() -> Callable[[str], list[str]]:
    import sentencex

    return lambda text: [s.strip() for s in sentencex.segment("en", text)]


def _splitters() -> tuple[dict[str, Callable[[str], list[str]]], list[str]]:
    """The splitters whose packages are installed, pysbd first; the names of those that are not."""
    found, missing = {"pysbd (older datastores)": split_sentences}, []
    for name, load in (("blingfire", _blingfire), ("syntok", _syntok), ("sentencex", _sentencex)):
        try:
            found[name] = load()
        except ImportError:
            missing.append(name)
    return found, missing


def boundaries(text: str, sentences: list[str]) -> set[int]:
    """End offsets of the sentences in `text` without whitespace (so splitters that trim differently agree)."""
    flat, ends, at = "".join(text.split()), set(), 0
    for s in sentences:
        at += len("".join(s.split()))
        ends.add(at)
    return ends if at == len(flat) else ends & set(range(len(flat) + 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.docs = 5
    splitters, missing = _splitters()
    if missing:
        print(f"# not installed, left out: {', '.join(missing)} (pip install {' '.join(missing)})")
    path = Path(os.environ.get("BERTKNN_DATA", "../shared/data")) / "wiki" / "lama_evidence_docs.jsonl"
    passages = [p for doc, _ in zip(iter_corpus(path), range(args.docs)) for p in doc.passages]
    print(f"{len(passages):,} passages ({sum(map(len, passages)):,} characters) from {args.docs:,} documents; 1 core")
    print("| splitter | sentences | sentences/s | passages/s | boundary precision | recall | F1 | passages as pysbd |")
    print("|---|---|---|---|---|---|---|---|")
    reference = None
    for name, split in splitters.items():
        split(passages[0])  # load models, compile rules
        began = time.perf_counter()
        result = [split(p) for p in passages]
        seconds = time.perf_counter() - began
        found = [boundaries(p, s) for p, s in zip(passages, result)]
        reference = reference or found
        shared = sum(len(a & b) for a, b in zip(found, reference))
        precision = shared / max(sum(map(len, found)), 1)
        recall = shared / max(sum(map(len, reference)), 1)
        same = sum(a == b for a, b in zip(found, reference)) / len(passages)
        n = sum(map(len, result))
        print(
            f"| {name} | {n:,} | {n / seconds:,.0f} | {len(passages) / seconds:,.1f} | {precision:.4f} | {recall:.4f} "
            f"| {2 * precision * recall / max(precision + recall, 1e-9):.4f} | {same:.1%} |"
        )


if __name__ == "__main__":
    main()
