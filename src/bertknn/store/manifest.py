"""A datastore's manifest.json: its format and version, the model, layer and key settings it was made with, and the
checks every command runs on reading it (`read_manifest`). `DatastoreError` is every datastore problem a user can
meet."""

from __future__ import annotations

import json
from pathlib import Path

from bertknn.text import FORMER_SPLITTER

FORMAT = "bertknn-datastore"
VERSION = 2  # new datastores' format: whole words (1: words of exactly one token)
VERSIONS = (1, 2)  # the formats this code opens
FLOAT16 = "float16"  # `key_codec` of keys stored as they are, uncompressed (codec.py has the others)
IDENTITY = ("model_hash", "layer", "dim", "pack", "int8")  # manifest fields SQLite keeps a copy of
REQUIRED = {"model": str, "model_hash": str, "layer": int, "dim": int, "status": str}
OPTIONAL = {
    "pack": int,
    "int8": bool,
    "corpus": (dict, type(None)),
    "tuned": dict,
    "entries": int,
    "embedded": int,
    "words_from": int,
    "names": bool,
    "key_codec": str,
    "key_codec_pending": str,
    "pruned": dict,
    "evidence": str,
}


class DatastoreError(ValueError):
    """A datastore that is missing, corrupt, incomplete, or made with another model or layer."""


class Manifest(dict):
    """A datastore's manifest as read (a dict of its fields), with what its fields mean read as properties."""

    @property
    def complete(self) -> bool:
        """True once every document of the corpus is embedded."""
        return self.get("status") == "complete"

    @property
    def lazy(self) -> bool:
        """True for a datastore whose documents are embedded on demand (`bertknn build --lazy`)."""
        return self.get("status") == "lazy"

    @property
    def layer(self) -> int:
        """The block whose states are the keys."""
        return int(self["layer"])

    @property
    def pack(self) -> int:
        """How many non-adjacent targets of a sentence were masked per pass when its keys were computed (1 = exact)."""
        return int(self.get("pack", 1))

    @property
    def splitter(self) -> str:
        """The sentence splitter its documents were split with (`text.FORMER_SPLITTER` for stores that do not say)."""
        return str(self.get("splitter", FORMER_SPLITTER))

    @property
    def key_dtype(self) -> str:
        """The precision the model ran in when the keys were computed ("float32" for stores that do not say)."""
        return str(self.get("key_dtype", "float32"))

    @property
    def int8_keys(self) -> bool:
        """True when keys were computed by the encoder quantised to int8 (`--int8-keys`), not in float32."""
        return bool(self.get("int8", False))

    @property
    def key_codec(self) -> str:
        """How keys are stored: "float16", or the FAISS factory string of their codec (`bertknn convert-keys`)."""
        return str(self.get("key_codec", FLOAT16))

    @property
    def pruned(self) -> dict | None:
        """How the store was pruned (`build/prune.py`: radius, contexts before), None for an unpruned one."""
        return self.get("pruned")


def read_manifest(path: Path) -> Manifest:
    """The manifest, checked: format, version and the fields every command needs, with their types."""
    file = path / "manifest.json"
    if not file.is_file():
        raise DatastoreError(f"{path} is not a datastore (no manifest.json); create one with `bertknn build`")
    try:
        manifest = json.loads(file.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DatastoreError(f"{file} is damaged ({err}); restore it from a copy or rebuild the datastore") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") not in VERSIONS:
        versions = " or ".join(map(str, VERSIONS))
        raise DatastoreError(f"{file} is not a {FORMAT} manifest of version {versions}")
    for field, kind in REQUIRED.items():
        if not isinstance(manifest.get(field), kind) or isinstance(manifest.get(field), bool):
            raise DatastoreError(
                f"{file} is damaged: field {field!r} is missing or not a {kind.__name__}; restore it or rebuild"
            )
    for field, kind in OPTIONAL.items():
        value = manifest.get(field)
        if field in manifest and (not isinstance(value, kind) or (isinstance(value, bool) and kind is int)):
            raise DatastoreError(f"{file} is damaged: field {field!r} has the wrong type; restore it or rebuild")
    if manifest["dim"] < 1 or manifest["layer"] < 0:
        raise DatastoreError(f"{file} is damaged: dim {manifest['dim']} / layer {manifest['layer']} are impossible")
    return Manifest(manifest)
