"""Compressed keys: a FAISS standalone codec (`sa_encode` / `sa_decode`) named by a factory string, trained on a
sample of a datastore's keys (a storage format of the keys, like float16: nothing here knows the model).

`float16` is the datastore's own form (2 bytes per dimension). The compressed forms are FAISS's encoders, named as
its factory strings name them: `SQ8` (one byte per dimension, a scale per dimension), `SQ4`, `PCA96,SQ8` (a PCA to
96 dimensions, then one byte each), `PQ48` (48 bytes: product quantisation, 256 centroids per sub-vector), ...
`Decoded` reads codes as keys, so the exact search (`index.exact`) and FAISS read a compressed store unchanged.
"""

from __future__ import annotations

import threading
from pathlib import Path

import faiss
import numpy as np

from bertknn.store import atomic

FORMS = ("SQ8", "SQ4", "PCA{d},SQ8", "PQ{m}")  # the factory strings the help names ({d}, {m}: numbers)


class KeyCodec:
    """A trained FAISS codec: keys of `dim` float values to codes of `code_size` bytes and back."""

    def __init__(self, name: str, index: faiss.Index) -> None:
        self.name, self.index = name, index
        self.dim, self.code_size = int(index.d), int(index.sa_code_size())

    @classmethod
    def train(cls, name: str, sample: np.ndarray) -> KeyCodec:
        """A codec of factory string `name` trained on `sample` (keys, one per row); ValueError for a string FAISS
        does not know, a codec without standalone codes, or a sample too small to train it."""
        sample = np.ascontiguousarray(sample, np.float32)
        try:
            index = faiss.index_factory(sample.shape[1], name, faiss.METRIC_L2)
        except RuntimeError as err:
            raise ValueError(f"bad key codec {name!r}: {str(err).splitlines()[-1]}; e.g. {', '.join(FORMS)}") from None
        try:
            if not index.is_trained:
                index.train(sample)
            index.sa_code_size()
        except RuntimeError as err:
            raise ValueError(
                f"cannot train key codec {name!r} on {len(sample):,} keys ({str(err).splitlines()[-1]})"
            ) from None
        return cls(name, index)

    def encode(self, keys: np.ndarray) -> np.ndarray:
        """Codes of keys (rows), uint8 of shape (n, code_size)."""
        return self.index.sa_encode(np.ascontiguousarray(keys, np.float32))

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Keys (float32 rows) from codes."""
        return self.index.sa_decode(np.ascontiguousarray(codes, np.uint8))

    def save(self, path: Path) -> None:
        """Write the trained codec whole (`atomic.write_file`)."""
        atomic.write_file(path, lambda handle: faiss.write_index(self.index, faiss.PyCallbackIOWriter(handle.write)))

    @classmethod
    def load(cls, path: Path, name: str) -> KeyCodec:
        return cls(name, faiss.read_index(str(path)))


class Decoded:
    """Compressed keys read as keys: rows indexed as `keys[rows]` are decoded on the fly (what `exact.nearest` and
    FAISS's re-ranking read)."""

    dtype = np.dtype(np.float32)  # what a read gives

    def __init__(self, codec: KeyCodec, codes: np.ndarray) -> None:
        self.codec, self.codes = codec, codes
        self.shape = (len(codes), codec.dim)
        self._scratch = threading.local()  # per thread: a copy of the codec that holds one question's codes

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, rows: np.ndarray | slice) -> np.ndarray:
        return self.codec.decode(np.asarray(self.codes[rows]))

    def distances(self, rows: np.ndarray, query: np.ndarray) -> np.ndarray:
        """Squared L2 from `query` to the decoded keys of `rows`, in their order. Computed on the codes (FAISS's
        asymmetric distances, over a scratch index that holds just these codes: no row is decoded, several times
        faster, bench/README.md) where the codec is a plain SQ or PQ; a codec with a transform (PCA) decodes, since
        its asymmetric distances live in the transformed space."""
        flat = self.codec.index
        if not isinstance(flat, faiss.IndexFlatCodes) or not len(rows):
            keys = self[rows]
            diff = keys - np.asarray(query, np.float32)
            return np.einsum("ij,ij->i", diff, diff)
        scratch = getattr(self._scratch, "index", None)
        if scratch is None:  # cloned once per thread (a PQ's clone costs more than its search)
            scratch = self._scratch.index = faiss.clone_index(flat)
        codes = np.ascontiguousarray(self.codes[rows], np.uint8)
        scratch.codes.resize(codes.size)
        faiss.memcpy(scratch.codes.data(), faiss.swig_ptr(codes), codes.size)
        scratch.ntotal = len(codes)
        found, order = scratch.search(np.asarray(query, np.float32).reshape(1, -1), len(codes))
        out = np.empty(len(codes), np.float32)
        out[order[0]] = found[0]
        return out
