"""How fast checksums are recorded and verified (bertknn verify), and what opening a store pays for its sample check.

Writes a file of random bytes (default 2 GiB) into a scratch directory, then times: recording its block checksums,
verifying every block, and the open-time check of SAMPLE_BLOCKS random blocks. The file is read from the page cache
after the first pass, so these are hashing rates, not disk rates. Usage: python bench/verify.py [--gib 2] [--dir D]
[--smoke] (--smoke: a file of 16 MiB).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from evidence import SMOKE

from bertknn.store.datastore import SAMPLE_BLOCKS
from bertknn.store.integrity import BLOCK, Checksums


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    if args.smoke:
        args.gib = 1 / 64
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp)
        size = int(args.gib * (1 << 30))
        rng = np.random.default_rng(0)
        with (path / "keys.f16").open("wb") as handle:
            for start in range(0, size, 1 << 26):
                handle.write(rng.integers(0, 256, min(1 << 26, size - start), dtype=np.uint8).tobytes())
        sums = Checksums(path)
        sums.record("keys.f16")  # warm the page cache
        print(f"cpu: {os.cpu_count()} cores; file {size / (1 << 30):.2f} GiB in {-(-size // BLOCK)} blocks")
        for name, run in (
            ("record", lambda: sums.record("keys.f16")),
            ("verify all blocks", lambda: sums.verify()),
            (f"open-time sample ({SAMPLE_BLOCKS} + last)", lambda: sums.verify(sample=SAMPLE_BLOCKS, seed=1)),
        ):
            times = []
            for _ in range(3):
                began = time.perf_counter()
                assert not run()
                times.append(time.perf_counter() - began)
            best = min(times)
            print(f"{name:<32} {best:7.3f} s  ({size / best / (1 << 30):5.2f} GiB/s of the file)")


if __name__ == "__main__":
    main()
