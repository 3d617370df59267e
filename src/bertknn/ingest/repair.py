"""`bertknn repair`: a datastore's damaged index files made again from what it keeps.

A datastore keeps its documents (store.sqlite), their keys, values and counts, and the manifest that says how they
were made; its indexes are made from these: the TF-IDF segments (tfidf_*) from the documents' text, the FAISS files
(faiss*) from the keys. `repair` runs every check of `bertknn verify` under the writer lock. A damaged segment is
indexed again from the stored text of the documents it covers; a damaged FAISS index is built again over every key
with its settings (faiss.json, else the copy SQLite keeps of it, else the defaults of `bertknn index`). Each is
written whole under a name the committed list does not hold, committed through the parts table in one transaction,
and only then are the damaged files deleted: a crash leaves the damaged index or the mended one, and a rerun finishes
the job. Damage to what the store keeps cannot be mended from the store: `repair` refuses it before writing anything
(`Unrepairable`), naming what is lost and the `bertknn build` that makes the datastore again.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss

from bertknn.index import NPROBE, faiss_files, faiss_index, retrieval, tfidf_files
from bertknn.index.faiss_index import FaissIndex
from bertknn.index.retrieval import SEGMENT_DOCS
from bertknn.store import names
from bertknn.store.datastore import CODEC, CODES, COUNTS, KEYS, SQLITE, VALUES, Datastore, DatastoreError
from bertknn.store.integrity import is_index_file
from bertknn.store.lock import BusyError
from bertknn.store.manifest import RECORD
from bertknn.store.records import Part
from bertknn.store.shards import SHARDS_FILE, directories, open_store, require_datastore
from bertknn.store.verify import verify
from bertknn.store.writer import DatastoreWriter, open_datastore_writer

# what a datastore keeps (checksums.json: the record that tells its damage), in the order a refusal names them
KEPT = ("manifest.json", SHARDS_FILE, SQLITE, KEYS, CODES, CODEC, VALUES, COUNTS, "checksums.json")
Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass
class Repair:
    """What `repair` did to the datastore at `path`: a line per part made again (none: it was sound), the notes of
    its checks (as `bertknn verify` prints them) and the checksum blocks it checked."""

    path: Path
    rebuilt: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    blocks: int = 0


class Unrepairable(DatastoreError):
    """What a datastore keeps is damaged, so its indexes cannot be made again from it: `repair` wrote nothing. The
    message names what is lost and the build that makes the datastore again; `problems` are the checks' findings."""

    def __init__(self, message: str, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


@dataclass
class _Found:
    """The checks of one datastore directory, sorted: damage to what it keeps, and the index parts to make again."""

    primary: list[str]
    segments: list[Part] = field(default_factory=list)  # listed TF-IDF segments a reader cannot trust
    faiss: bool = False  # the FAISS index is damaged: built again
    faiss_files: set[str] = field(default_factory=set)  # its files that checksums found damaged
    damaged: set[str] = field(default_factory=set)  # the index files checksums found damaged (or a directory in place)
    stray: list[str] = field(default_factory=list)  # damaged index files no list names (left by an interrupted writer)
    names: bool = False  # the names index lacks live documents' titles: made again from the documents
    notes: list[str] = field(default_factory=list)
    blocks: int = 0


def repair(
    path: str | Path, progress: Progress | None = None, wait: float | None = None, segment_docs: int = SEGMENT_DOCS
) -> Repair:
    """Check the datastore at `path` as `bertknn verify` does, under its writer lock (every shard's, in order, for a
    sharded one; `wait` as `open_writer` takes it), and make every damaged index part again from what the
    store keeps; `progress(phase, done, total)` follows the checks and the work. Unrepairable (nothing written) when
    what the store keeps is damaged."""
    path = Path(path)
    report = progress or (lambda phase, done, total: None)
    writers = _open(path, wait)
    stores = [writer.store for writer in writers]
    try:
        with contextlib.ExitStack() as held:
            for writer in writers:
                held.enter_context(writer.commit())
            found = [_find(store, report) for store in stores]
            primary = [problem for one in found for problem in one.primary]
            if primary:  # raised inside the commit: nothing is sealed, nothing was written
                raise _refusal(path, primary)
            done = Repair(path, notes=[n for one in found for n in one.notes], blocks=sum(f.blocks for f in found))
            done.rebuilt = _mend(list(zip(stores, found)), path, report, segment_docs)
    finally:
        for writer in writers:
            writer.close()
    return done


def _open(path: Path, wait: float | None) -> list[DatastoreWriter]:
    """The writers of the datastore at `path` (its shards', in shard order, as every writer of a sharded datastore
    takes the locks), their tails not checked (every block is checked here); Unrepairable when it is too damaged to
    open (its manifest, shards.json, SQLite...)."""
    require_datastore(path)
    writers: list[DatastoreWriter] = []
    try:
        for directory in directories(path):
            writers.append(open_datastore_writer(directory, wait, check_tails=False))
    except DatastoreError as err:
        for writer in writers:
            writer.close()
        if isinstance(err, BusyError):
            raise
        raise _refusal(path, [str(err)]) from None
    return writers


def _keep(reader: Callable[[Path], list[str]], into: list[str]) -> Callable[[Path], list[str]]:
    """`reader`, its findings also kept in `into`."""

    def read(path: Path) -> list[str]:
        found = reader(path)
        into.extend(found)
        return found

    return read


def _find(store: Datastore, report: Progress) -> _Found:
    """`verify` of one directory, its findings sorted into damage to what the store keeps and index parts to mend."""
    ir: list[str] = []
    knn: list[str] = []
    checked = verify(
        store.path,
        progress=lambda done, total: report("verifying", done, total),
        readers=(_keep(retrieval.problems, ir), _keep(faiss_files.problems, knn)),
    )
    damage = [d for d in checked.damage if is_index_file(d.file)]
    lacking = names.problems(store.db)
    mendable = {str(d) for d in damage} | set(ir) | set(knn) | set(lacking)
    found = _Found([p for p in checked.problems if p not in mendable], notes=checked.notes, blocks=checked.blocks)
    found.names = bool(lacking)
    if found.primary:
        return found
    files = found.damaged = {d.file for d in damage}
    segments = tfidf_files.listed(store)
    found.segments = retrieval.damaged_parts(store, files, segments)
    if ir and not found.segments:  # the list of segments itself does not hold together: store.sqlite's parts table
        found.primary += ir
    in_segments = {name for part in segments for name in tfidf_files.part_files(part.name)}
    found.faiss_files = {f for f in files if f.startswith("faiss")}
    parts = store.parts(faiss_files.KIND)
    in_faiss = {faiss_files.SETTINGS_FILE, faiss_files.TRAINED_FILE, *(p.name for p in parts or [])}
    found.faiss = bool(knn) or any(parts is None or f in in_faiss for f in found.faiss_files)
    tfidf_stray = [f for f in files if f.startswith("tfidf") and f not in in_segments]
    found.stray = sorted(tfidf_stray + [f for f in found.faiss_files if parts is not None and f not in in_faiss])
    return found


def _mend(shards: list[tuple[Datastore, _Found]], top: Path, report: Progress, docs: int) -> list[str]:
    """Make the damaged index parts of each directory again (under their writer locks), the TF-IDF segments of all
    first (a sharded datastore's quantizer may be trained again on all its shards, which are then opened whole); a
    line for each, naming the shard in a sharded datastore."""
    lines: list[str] = []
    todo = [(store, found) for store, found in shards if found.segments or found.faiss or found.stray or found.names]
    for store, found in todo:
        lines += _where(store, top, _mend_names(store) if found.names else [])
    for store, found in todo:
        if store.parts(tfidf_files.KIND) is None:  # a store made before parts were listed: listed first, as writers do
            store.writer.commit_parts(tfidf=tfidf_files.listed(store), faiss=faiss_files.listing(store))
        lines += _where(store, top, _mend_segments(store, found.segments, docs))
    for store, found in todo:
        lines += _where(store, top, _mend_faiss(store, found, shards, top, report) if found.faiss else [])
    for store, found in todo:
        lines += _where(store, top, _clean(store, found))
        left = retrieval.problems(store.path) + faiss_files.problems(store.path)
        if left:
            raise DatastoreError(f"{store.path}: its index is still damaged after the repair: {left[0]}")
    return lines


def _mend_names(store: Datastore) -> list[str]:
    """The names index made again from the documents' titles and aliases, in one transaction."""
    with store.sqlite_errors(), store.writer.db as db:
        rows = names.rebuild(db)
    return [f"the names index (in {SQLITE}): made again from the documents' titles and aliases, {rows:,} names"]


def _clean(store: Datastore, found: _Found) -> list[str]:
    """After the commits: delete the index parts no list names now (those the repair replaced, and stray damaged
    ones), a directory in the place of a damaged file first (the indexes' `retire` deletes files); a line for each
    stray file. An OSError here (a permission, say) comes after the repair was committed: the DatastoreError says so
    and names what is left to delete by hand."""
    try:
        for name in sorted(found.damaged):
            if (store.path / name).is_dir() and not (store.path / name).is_symlink():
                store.writer.rewriting(name)
                shutil.rmtree(store.path / name)
        gone = set(tfidf_files.retire(store)) | set(faiss_files.retire(store))
    except OSError as err:
        left = ", ".join(str(store.path / name) for name in _unlisted(store))
        raise DatastoreError(
            f"{store.path}: the repair is committed (readers use the rebuilt index), but deleting the files it "
            f"replaced failed ({err}); delete by hand: {left}"
        ) from None
    lines = []
    for file in found.stray:
        where = "deleted" if file.split("/")[0] in gone or not (store.path / file).exists() else "left"
        lines.append(f"{file}: damaged, and no index lists it (an interrupted writer's): {where}")
    return lines


def _unlisted(store: Datastore) -> list[str]:
    """The index files and folders on disk that no committed list names (a directory in the place of one included):
    what the cleanup after a repair's commit deletes."""
    names = []
    for kind, on_disk in ((tfidf_files.KIND, tfidf_files.on_disk), (faiss_files.KIND, faiss_files.on_disk)):
        listed = {part.name for part in store.parts(kind) or []}
        for name in on_disk(store.path):
            if name not in listed:
                names += tfidf_files.part_files(name) if name == tfidf_files.BASE else [name]
    return sorted({name for name in names if (store.path / name).exists()})


def _where(store: Datastore, top: Path, lines: list[str]) -> list[str]:
    """`lines` about `store`, each led by its shard's directory when it is a shard of the datastore at `top`."""
    return lines if store.path == top else [f"{store.path.relative_to(top)}: {line}" for line in lines]


def _mend_segments(store: Datastore, damaged: list[Part], segment_docs: int) -> list[str]:
    """Each damaged TF-IDF segment indexed again from the stored documents, all committed in one transaction."""
    if not damaged:
        return []
    tfidf_files.retire(store)  # what no list names, which may hold the names the new segments take
    new = {part: retrieval.rebuilt(store, part, segment_docs) for part in damaged}
    store.writer.commit_parts(tfidf=[new.get(part, part) for part in store.parts(tfidf_files.KIND) or []])
    return [
        f"TF-IDF segment {_segment_name(part)} (documents {part.first:,}..{part.stop:,}): indexed again from the "
        f"stored documents, as {new[part].name}"
        for part in damaged
    ]


def _segment_name(part: Part) -> str:
    return "tfidf_*.npy and tfidf_ndocs.txt" if part.name == tfidf_files.BASE else part.name


def _mend_faiss(
    store: Datastore, found: _Found, shards: list[tuple[Datastore, _Found]], top: Path, report: Progress
) -> list[str]:
    """The FAISS index built again over every key with its settings (or, where only faiss.json is lost and SQLite
    keeps a copy of it, faiss.json written again)."""
    settings, source = faiss_files.rebuild_settings(store, faiss_files.SETTINGS_FILE in found.faiss_files)
    damaged = ", ".join(sorted(found.faiss_files)) or "unreadable"
    if found.faiss_files == {faiss_files.SETTINGS_FILE} and source == faiss_files.FROM_COPY:
        faiss_files.write_settings(store, settings)
        if not faiss_files.problems(store.path):
            return [f"FAISS settings (faiss.json): written again from the copy in {SQLITE}"]
    trained, kept = None, False
    if source != faiss_files.FROM_DEFAULTS:  # the default settings may not be those the trained index was made with
        trained, kept = _trained(store, found, shards)
        if trained is None and len(shards) > 1:  # one quantizer for all shards, trained as their build trained it
            with open_store(top) as whole:
                trained, settings["train_size"] = faiss_index.train(
                    whole, settings["factory"], settings["train_size"], settings["seed"]
                )
    built = FaissIndex.rebuild(
        store, settings, trained, kept, progress=lambda done, total: report("indexing", done, total)
    )
    origin = {faiss_files.FROM_FILE: "faiss.json", faiss_files.FROM_COPY: f"the copy of faiss.json in {SQLITE}"}
    said = origin.get(source, "the defaults of `bertknn index` (faiss.json is lost and has no copy)")
    return [
        f"FAISS index ({damaged}): built again over {built.ntotal:,} keys, {settings['factory']} with nprobe "
        f"{settings['nprobe']}, its settings from {said}"
    ]


def _trained(
    store: Datastore, found: _Found, shards: list[tuple[Datastore, _Found]]
) -> tuple[faiss.Index | None, bool]:
    """A sound trained index to fill again: this store's faiss_trained.index (then True: it is kept as it is), else
    another shard's (all shards share one), else None."""
    for other, its in [(store, found), *((s, f) for s, f in shards if s is not store)]:
        if faiss_files.TRAINED_FILE not in its.faiss_files:
            trained = faiss_files.sound_trained(other)
            if trained is not None:
                return trained, other is store
    return None, False


def _refusal(path: Path, problems: list[str]) -> Unrepairable:
    """The refusal of a datastore whose kept data is damaged: what is lost, and the build that makes it again."""
    lost: list[str] = []
    for problem in problems:  # the file a finding is about is the kept file it names first
        found = sorted((problem.find(name), name) for name in KEPT if name in problem)
        if found and found[0][1] not in lost:
            lost.append(found[0][1])
    named = ", ".join(lost or ["its files"])
    message = (
        f"{path} cannot be repaired: what it keeps is damaged ({named}), and its indexes are made from that; nothing "
        f"was written. Restore {named} from a copy (`bertknn verify {path}` checks it then), or move {path} aside and "
        f"build the datastore again from its corpus: {rebuild_commands(path)}"
    )
    return Unrepairable(message, problems)


def rebuild_commands(path: str | Path) -> str:
    """The commands that make the datastore at `path` again from its corpus, with the settings its manifest records
    (what SQLite keeps of them where the manifest is unreadable; placeholders in capitals for what nothing records)."""
    path = Path(path)
    made = _recorded(path)
    corpus: dict = made["corpus"] if isinstance(made.get("corpus"), dict) else {}
    pruned: dict = made["pruned"] if isinstance(made.get("pruned"), dict) else {}
    out = path.with_name(f"{path.name}-unpruned") if pruned else path
    build = ["bertknn", "build", str(corpus.get("path") or "CORPUS"), "--out", str(out)]
    build += ["--model", str(made.get("model") or "MODEL")]
    build += ["--layer", str(made["layer"])] if isinstance(made.get("layer"), int) else []
    flags = {
        "--pack": made.get("pack") if made.get("pack") not in (None, 1) else None,
        "--int8-keys": made.get("int8") is True,
        "--one-token-words": made.get("version") == 1,
        "--names": made.get("names") is True,
        "--lazy": made.get("status") == "lazy",
        "--dtype": made.get("key_dtype") if made.get("key_dtype") not in (None, "float32") else None,
        "--engine": "ray" if "shard_docs" in made else None,
        "--shard-docs": made.get("shard_docs"),
    }
    for flag, value in flags.items():
        build += [] if value in (None, False) else [flag] if value is True else [flag, str(value)]
    commands = [shlex.join(build)]
    if pruned:
        commands.append(shlex.join(["bertknn", "prune", str(out), str(path), "--radius", str(pruned.get("radius"))]))
    if made.get("key_codec") not in (None, "float16"):
        commands.append(shlex.join(["bertknn", "convert-keys", str(path), "--key-codec", str(made["key_codec"])]))
    settings: dict = made["faiss"] if isinstance(made.get("faiss"), dict) else {}
    if isinstance(settings.get("factory"), str):
        index = ["bertknn", "index", str(path), "--factory", settings["factory"]]
        trains = isinstance(settings.get("train_size"), int) and _trains(settings["factory"], made.get("dim"))
        index += ["--train-size", str(settings["train_size"])] if trains else []
        nprobe = settings.get("nprobe")
        index += ["--nprobe", str(nprobe)] if isinstance(nprobe, int) and nprobe != NPROBE else []
        commands.append(shlex.join(index))
    text = "`" + "`, then `".join(commands) + "`"
    if not made.get("model") and made.get("model_hash"):
        text += f" (MODEL: the model whose weights have sha256 {made['model_hash'][:12]})"
    changed = made.get("changed_documents")
    if changed:
        text += f"; {changed:,} documents were added or removed after the build: add or remove them again"
    return text


def _trains(factory: str, dim: Any) -> bool:
    """Whether a FAISS index of `factory` learns from a sample of keys (IVF, PQ...; Flat and HNSW do not)."""
    with contextlib.suppress(RuntimeError, TypeError, ValueError):
        return not faiss.index_factory(int(dim), factory).is_trained
    return True


def _recorded(path: Path) -> dict:
    """What the datastore at `path` records of how it was made: its manifest (shards.json for a sharded one), else
    SQLite's copy of its model and key settings; its FAISS settings; how many documents changed since the build."""
    made: dict = {}
    for name in (SHARDS_FILE, "manifest.json"):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads((path / name).read_text(encoding="utf-8"))
            made = data if isinstance(data, dict) else made
    first = path
    with contextlib.suppress(DatastoreError, IndexError):
        first = directories(path)[0]
    with contextlib.suppress(OSError, ValueError):
        made["faiss"] = json.loads((first / faiss_files.SETTINGS_FILE).read_text(encoding="utf-8"))
    with contextlib.suppress(sqlite3.Error, OSError, ValueError, TypeError, AttributeError):
        db = sqlite3.connect(f"{(first / SQLITE).resolve().as_uri()}?mode=ro", uri=True)
        try:
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
            made = {**json.loads(meta.get("identity", "{}")), **made}
            if "shards" not in made:  # what was committed after the manifest was written (manifest.RECORD)
                made |= {k: v for k, v in json.loads(meta.get(RECORD, "{}")).items() if v is not None}
            if faiss_files.SETTINGS_COPY in meta and not isinstance(made.get("faiss"), dict):
                made["faiss"] = json.loads(meta[faiss_files.SETTINGS_COPY])
            documents = int((made.get("corpus") or {}).get("documents") or 0)
            if documents and "shards" not in made:
                query = "SELECT count(*) FROM documents WHERE idx >= ? OR state != 'live'"
                made["changed_documents"] = db.execute(query, (documents,)).fetchone()[0]
        finally:
            db.close()
    return made
