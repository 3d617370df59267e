"""A datastore's manifest: its format and version, the model, layer and key settings it was made with, and the
checks every command runs on reading it (`read_manifest`). `DatastoreError` is every datastore problem a user can
meet.

manifest.json is written once, when the store is created. The fields that change after (`COMMITTED`: the build's
status and counts, the corpus, the key codec, the evidence model, tuned settings) are committed to store.sqlite, in
one meta row (`RECORD`) that a writer replaces in a transaction (`DatastoreWriter.set_manifest`); a reader's
manifest is the file's fields with the record's over them (`with_record`). A store made before the record has its
latest values in manifest.json, which hold until a writer first commits a change."""

from __future__ import annotations

import json
from pathlib import Path

from bertknn.text import FORMER_SPLITTER

FORMAT = "bertknn-datastore"
VERSION = 2  # new datastores' format: whole words (1: words of exactly one token)
VERSIONS = (1, 2)  # the formats this code opens
FLOAT16 = "float16"  # `key_codec` of keys stored as they are, uncompressed (codec.py has the others)
COMMITTED = (
    "status",
    "documents",
    "embedded",
    "entries",
    "corpus",
    "key_codec",
    "key_codec_pending",
    "evidence",
    "tuned",
)
RECORD = "manifest"  # the meta row of store.sqlite that holds the committed fields (JSON)
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
    "store_id": str,
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
        """How the store was pruned (`ingest/prune.py`: radius, contexts before), None for an unpruned one."""
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
    return _checked(manifest, str(file))


def with_record(manifest: Manifest, record: str | None, where: str) -> Manifest:
    """The manifest as committed: the fields of the commit record (`RECORD`, JSON; None where none was written) over
    manifest.json's; `where` names the record in errors."""
    if record is None:
        return manifest
    try:
        fields = json.loads(record)
        if not isinstance(fields, dict) or set(fields) - set(COMMITTED):
            raise ValueError("not an object of the committed fields")
    except ValueError as err:
        raise DatastoreError(f"{where} is damaged ({err}); restore it from a copy or rebuild the datastore") from None
    return _checked({k: v for k, v in {**manifest, **fields}.items() if v is not None}, where)  # None: removed


def _checked(manifest: dict, where: str) -> Manifest:
    """The fields every command needs, with their types (`where` names what holds them in errors)."""
    for field, kind in REQUIRED.items():
        if not isinstance(manifest.get(field), kind) or isinstance(manifest.get(field), bool):
            raise DatastoreError(
                f"{where} is damaged: field {field!r} is missing or not a {kind.__name__}; restore it or rebuild"
            )
    for field, kind in OPTIONAL.items():
        value = manifest.get(field)
        if field in manifest and (not isinstance(value, kind) or (isinstance(value, bool) and kind is int)):
            raise DatastoreError(f"{where} is damaged: field {field!r} has the wrong type; restore it or rebuild")
    if manifest["dim"] < 1 or manifest["layer"] < 0:
        raise DatastoreError(f"{where} is damaged: dim {manifest['dim']} / layer {manifest['layer']} are impossible")
    return Manifest(manifest)
