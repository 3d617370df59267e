"""Commands on a datastore: build, ask, index, sentences, add, remove, verify, repair."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from bertknn.cli.main import (
    BackendOption,
    DatastoreArg,
    DeviceOption,
    DtypeOption,
    Int8Option,
    PackOption,
    ThreadsOption,
    WaitOption,
    _build,
    _writer_wait,
    command,
)
from bertknn.cli.options import QuerySettings
from bertknn.console import console, phase_progress, render, shown
from bertknn.index import NPROBE
from bertknn.model.default_model import DEFAULT_MODEL
from bertknn.model.runtime import CLI_BACKEND
from bertknn.store.lock import CLI_WAIT_S

if TYPE_CHECKING:
    from bertknn.ingest.corpus import Corpus

SKIPPED_SHOWN = 10  # entries of no corpus format a note names; the rest are counted


CorpusArg = Annotated[
    Path,
    typer.Argument(
        help="corpus: a JSONL file ({id, title, text} per line), a .parquet file or a directory of them (columns "
        "id, title, text: the layout of wikimedia/wikipedia), DrQA's docs.db (SQLite) or a Wikipedia XML dump "
        "(.xml, .xml.bz2; needs pip install 'bertknn[wikipedia]')"
    ),
]
OneTokenWordsOption = Annotated[
    bool,
    typer.Option(
        "--one-token-words",
        help="store only words of one wordpiece, as the paper does (datastore format 1): a word of several, such "
        "as most names, is then never a kNN answer",
    ),
]
NamesOption = Annotated[
    bool,
    typer.Option(
        "--names",
        help="store each run of 2-4 capitalised words (Port Elsmere, Ada Lovelace) as one answer too, besides its "
        "words (more contexts: bench/README.md gives the cost and what it gains)",
    ),
]
WorkersOption = Annotated[
    int,
    typer.Option(
        min=0,
        help="local: processes that split sentences and hash IR features [default: every core for 5,000+ "
        "documents]; ray: key-stage workers (one GPU each on CUDA) [default: 1]",
    ),
]
EngineOption = Annotated[
    str, typer.Option(help="local: this process; ray: shards built on a Ray cluster (pip install 'bertknn[ray]')")
]
KeyCodecOption = Annotated[
    str,
    typer.Option(
        help="how keys are stored: float16, or a FAISS codec (SQ8: 1 byte per dimension, SQ4, PCA{d},SQ8, PQ{m}: m "
        "bytes), trained on the built keys (`bertknn convert-keys` converts a store later; bench/README.md compares)"
    ),
]
AddressOption = Annotated[
    str | None, typer.Option(help="ray: the cluster's address ('auto': the running one) [default: a local one]")
]


@command(
    interrupted="what was committed is kept; rerun the same command to resume {out}",
    example="bertknn build my_docs.jsonl --out my_store",
)
def build(
    corpus: CorpusArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="datastore directory to create (or resume)")],
    model: Annotated[str, typer.Option(help="HF masked LM: hub name or local directory")] = DEFAULT_MODEL,
    layer: Annotated[int | None, typer.Option(help="block whose states are keys [default: second-to-last]")] = None,
    lazy: Annotated[bool, typer.Option(help="embed each document only when retrieval first picks it")] = False,
    pack: PackOption = 1,
    int8_keys: Int8Option = False,
    one_token_words: OneTokenWordsOption = False,
    names: NamesOption = False,
    backend: BackendOption = CLI_BACKEND,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "float32",
    threads: ThreadsOption = 0,
    workers: WorkersOption = 0,
    engine: EngineOption = "local",
    address: AddressOption = None,
    shard_docs: Annotated[int, typer.Option(min=1, help="ray: documents per shard")] = 50_000,
    key_codec: KeyCodecOption = "float16",
    wait: WaitOption = CLI_WAIT_S,
) -> None:
    """Embed every content word of a corpus (whole words, of any number of wordpieces) into a datastore and index its
    documents. Rerun to resume."""
    from bertknn.ingest.corpus import open_corpus

    if engine not in ("local", "ray"):
        raise typer.BadParameter(f"--engine must be local or ray, not {engine!r}")
    _note_skipped(open_corpus(corpus))
    if engine == "ray":
        if lazy or pack != 1 or int8_keys or one_token_words or names:
            raise typer.BadParameter(
                "--engine ray builds exact, complete shards of whole words: drop --lazy, --pack, --int8-keys, "
                "--one-token-words and --names"
            )
        _build_on_ray(corpus, out, model, layer, workers or 1, shard_docs, address, backend, key_codec)
        return
    with _writer_wait(out, wait):
        options = {"lazy": lazy, "pack": pack, "runtime": backend, "int8_keys": int8_keys, "n_workers": workers}
        options.update(whole_words=not one_token_words, names=names, key_codec=key_codec)
        _build(corpus, out, model, layer, **options)


def _note_skipped(source: Corpus) -> None:
    """Name what a corpus directory holds besides corpus files (`Corpus.skipped`): read as no documents."""
    if source.skipped:
        shown_names = source.skipped[:SKIPPED_SHOWN]
        more = len(source.skipped) - len(shown_names)
        listed = ", ".join(shown_names) + (f" and {more:,} more" if more else "")
        console.print(
            f"[yellow]note:[/] {shown(source.name)}: skipped {len(source.skipped):,} entries of no corpus format: "
            f"{shown(listed)}"
        )


def _build_on_ray(
    corpus: Path,
    out: Path,
    model: str,
    layer: int | None,
    workers: int,
    shard_docs: int,
    address,
    runtime,
    key_codec: str = "float16",
):
    """`build --engine ray`: shards on Ray (their keys then converted to `key_codec` here, shard by shard, as
    `convert-keys` does), then say what the sharded datastore holds."""
    from bertknn.ingest import distributed
    from bertknn.ingest.ingester import Writer
    from bertknn.store.shards import open_store

    began = time.time()
    with phase_progress() as report:
        top = distributed.build(corpus, out, model, layer, workers, shard_docs, address, runtime, report)
        if key_codec != "float16":
            with open_store(out) as store, Writer(store) as writer:
                writer.convert_keys(key_codec, progress=lambda done, total: report("encoding", done, total))
    console.print(
        f"sharded datastore {shown(str(out))}: {len(top['shards'])} shards, {top['documents']:,} documents, "
        f"{top['entries']:,} contexts, model {shown(str(top['model']))}, layer {top['layer']} "
        f"({time.time() - began:,.0f}s)"
    )


@command(example='bertknn ask my_store "Dante was born in [MASK] ." --subject Dante')
def ask(
    datastore: DatastoreArg,
    question: Annotated[str, typer.Argument(help="cloze question with exactly one [MASK]")],
    subject: Annotated[str | None, typer.Option(help="subject of a knowledge-base question (steers retrieval)")] = None,
    top_k: Annotated[int, typer.Option(min=1, max=1000, help="answers (words) to list")] = 10,
    settings: QuerySettings = None,
    model: Annotated[str | None, typer.Option(help="model [default: the datastore's]")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the answer as JSON, each ranking also in the fill-mask format")
    ] = False,
    backend: BackendOption = CLI_BACKEND,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "float32",
    threads: ThreadsOption = 0,
) -> None:
    """Answer a cloze question: BERT, kNN and BERT-kNN side by side, with the evidence sentences."""
    from bertknn.query.pipeline import BertKNN

    knn = BertKNN.load(datastore, model, runtime=backend, **settings)
    prediction = knn.predict(question, subject=subject, top_k=top_k)
    if as_json:
        typer.echo(json.dumps(prediction.to_dict(knn.encoder.tokenizer), indent=1))  # plain: never wrapped
    else:
        console.print(render(prediction, top_k))


@command(
    interrupted="what was saved is kept; rerun the same command to resume {datastore}",
    example='bertknn index my_store\nbertknn ask my_store "Dante was born in [MASK] ." --retrieval faiss',
)
def index(
    datastore: DatastoreArg,
    factory: Annotated[
        str,
        typer.Option(
            help="FAISS index factory string (Flat, IVF4096,PQ64, HNSW32...); auto: Flat below 20k keys, "
            "else IVF with ~4 sqrt(n) lists and PQ dim/12"
        ),
    ] = "auto",
    train_size: Annotated[
        int | None, typer.Option(min=1, help="random keys to train on [default: 50 per IVF list, at least 100k]")
    ] = None,
    nprobe: Annotated[int, typer.Option(min=1, help="IVF lists searched per query")] = NPROBE,
    engine: Annotated[
        str, typer.Option(help="local (one shard after another, here) or ray (shards filled by parallel Ray tasks)")
    ] = "local",
    address: Annotated[str | None, typer.Option(help="ray: the cluster's address [default: a local one]")] = None,
    threads: ThreadsOption = 0,
    wait: WaitOption = CLI_WAIT_S,
) -> None:
    """Index every key of a datastore with FAISS (for `--retrieval faiss`). Rerun to resume."""
    import faiss

    from bertknn.ingest.ingester import Writer
    from bertknn.store.shards import open_store

    faiss.omp_set_num_threads(threads or os.cpu_count() or 1)
    began = time.time()
    writer = Writer(open_store(datastore))
    if engine not in ("local", "ray"):
        raise typer.BadParameter(f"--engine is local or ray (the shards filled in parallel), not {engine!r}")
    options = {"on_ray": True} if engine == "ray" else {}
    if engine == "ray":
        from bertknn.ingest.distributed import start_ray

        start_ray(address)
    with _writer_wait(datastore, wait), phase_progress() as report, writer:
        report("indexing", 0, writer.store.size)
        built = writer.index_keys(
            factory, train_size, nprobe, progress=lambda done, total: report("indexing", done, total), **options
        )
    console.print(
        f"FAISS index {built.settings['factory']!r} over {built.ntotal:,} keys in {built.where} "
        f"({time.time() - began:,.0f}s); ask with --retrieval faiss"
    )


@command(
    interrupted="the vectors stored so far are kept; rerun the same command to go on",
    example="bertknn sentences my_store",
)
def sentences(
    datastore: DatastoreArg,
    backend: BackendOption = CLI_BACKEND,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "float32",
    threads: ThreadsOption = 0,
) -> None:
    """Store the evidence vectors of a datastore made before them: each entry's sentence, word and clause embedded by
    the sentence encoder, so that its questions weigh their neighbours' sentences (a datastore built or added to now
    stores them as it goes; until then its questions are answered without the weights). Rerun to resume."""
    from bertknn.ingest.evidence_encoding import fill
    from bertknn.store.writers import open_writer

    began, filled = time.time(), 0
    with phase_progress() as report, open_writer(datastore) as writer:
        for shard in writer.store.shards:
            filled += fill(shard, backend, lambda done, total: report("embedding", done, total))
    console.print(
        f"evidence vectors stored for {filled:,} entries of {shown(str(datastore))} ({time.time() - began:,.0f}s); "
        "its questions weigh their neighbours' sentences"
        if filled
        else f"{shown(str(datastore))} holds the evidence vectors of all its entries already: nothing to do"
    )


@command(
    interrupted="the keys are still read as they were; rerun the same command to resume {datastore}",
    example="bertknn convert-keys my_store --key-codec SQ4",
)
def convert_keys(
    datastore: DatastoreArg,
    key_codec: Annotated[
        str,
        typer.Option(
            help="FAISS factory string of the codec: SQ8 (1 byte per dimension), SQ4, PCA{d},SQ8, PQ{m} (m bytes); "
            "bench/README.md compares them"
        ),
    ],
    train_size: Annotated[int, typer.Option(min=1, help="keys the codec is trained on, drawn at random")] = 50_000,
    wait: WaitOption = CLI_WAIT_S,
) -> None:
    """Store a datastore's float16 keys compressed by a codec (resumable): questions read the codes from then on."""
    from bertknn.ingest.ingester import Writer
    from bertknn.store.shards import open_store

    writer = Writer(open_store(datastore))
    began, before = time.time(), writer.store.keys_file()
    with _writer_wait(datastore, wait), phase_progress() as report, writer:
        report("encoding", 0, writer.store.size)
        writer.convert_keys(key_codec, train_size, progress=lambda done, total: report("encoding", done, total))
    name, width = writer.store.keys_file()
    console.print(
        f"keys of {shown(str(datastore))} as {shown(key_codec)}: {width} bytes per key in {name} (were {before[1]} "
        f"in {before[0]}; {time.time() - began:,.0f}s)"
    )


@command(
    interrupted="{datastore} is left as it was; rerun the same command to go on with {out}",
    example="bertknn prune my_store my_store_pruned --radius 40",
)
def prune(
    datastore: DatastoreArg,
    out: Annotated[Path, typer.Argument(help="directory of the pruned copy (new, or a pruning begun there)")],
    radius: Annotated[
        float,
        typer.Option(
            min=0,
            help="merge a document's entries of one word whose keys lie within this squared L2 distance of a kept "
            "one (the vote's units, like --temperature); bench/README.md measures radii",
        ),
    ],
    wait: WaitOption = CLI_WAIT_S,
) -> None:
    """Copy a datastore with each document's near-duplicate entries merged into one that counts for all (resumable)."""
    from bertknn.ingest.prune import prune as prune_store

    began = time.time()
    with _writer_wait(datastore, wait), phase_progress() as report:
        pruned = prune_store(datastore, out, radius, progress=lambda done, total: report("pruning", done, total))
    before, kept = (pruned.manifest.get("pruned") or {}).get("from_entries"), pruned.size
    pruned.close()
    shown_before = f" of {before:,}" if before else ""
    console.print(
        f"{shown(str(out))}: {kept:,} entries{shown_before} ({time.time() - began:,.0f}s); `bertknn index` "
        "makes its FAISS index"
    )


@command(
    interrupted="nothing half-added is searchable; rerun the same command to finish",
    example="bertknn add my_store new_facts.jsonl",
)
def add(
    datastore: DatastoreArg,
    corpus: Annotated[Path, typer.Argument(help="documents to add, in any corpus format `bertknn build` reads")],
    backend: BackendOption = CLI_BACKEND,
    device: DeviceOption = "auto",
    dtype: DtypeOption = "float32",
    threads: ThreadsOption = 0,
    wait: WaitOption = CLI_WAIT_S,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="a document whose id is in the datastore with other text replaces it, in the one transaction that "
            "publishes the new text (otherwise refused)",
        ),
    ] = False,
) -> None:
    """Add documents: embedded and indexed in place, searchable at once. Rerun after a crash to complete it."""
    from bertknn.ingest.corpus import open_corpus
    from bertknn.ingest.ingester import Writer

    source = open_corpus(corpus)
    _note_skipped(source)
    docs = list(source)  # the whole corpus is read first: a bad line changes nothing
    writer = Writer.open(datastore, runtime=backend)
    with _writer_wait(datastore, wait), phase_progress() as report, writer:
        added = writer.add_documents(
            docs, skip_existing=True, progress=lambda n: report("embedding", n, len(docs)), replace=replace
        )
    replaced, skipped = len(writer.staged.replaced), len(writer.staged.unchanged)
    console.print(
        f"added {len(docs) - skipped:,} documents ({added:,} contexts) to {shown(str(datastore))}"
        + (f", {replaced:,} of them replacing the text held under their ids" if replaced else "")
        + (f"; {skipped:,} were there already" if skipped else "")
    )
    if writer.completed:  # staged by an add that was interrupted: published with these (a rerun would have too)
        ids = ", ".join(map(repr, writer.completed[:5])) + (" ..." if len(writer.completed) > 5 else "")
        console.print(
            f"[yellow]note:[/] {len(writer.completed):,} more document(s) an interrupted add had staged were "
            f"published with them: {shown(ids)}"
        )
    if writer.faiss_error is not None:  # IR questions find the new documents; FAISS ones do not until repaired
        console.print(
            f"[yellow]note:[/] the FAISS index was not extended ({shown(str(writer.faiss_error))}); the command "
            "this names makes it whole again, with the new documents"
        )


@command(example="bertknn remove my_store --doc y1 --doc y2")
def remove(
    datastore: DatastoreArg,
    doc: Annotated[list[str], typer.Option("--doc", help="id of a document to hide (repeatable)")],
    wait: WaitOption = CLI_WAIT_S,
) -> None:
    """Remove documents: hidden from IR, kNN and FAISS search at once, all or none (their stored rows are kept)."""
    from bertknn.ingest.ingester import Writer
    from bertknn.store.shards import open_store

    with _writer_wait(datastore, wait), Writer(open_store(datastore)) as writer:
        removed, before = writer.remove_documents(doc)
    console.print(
        f"removed {len(removed)} document(s) from {shown(str(datastore))}"
        + (f"; already removed before: {shown(', '.join(before))}" if before else "")
    )


@command(example="bertknn verify my_store")
def verify(
    datastore: DatastoreArg,
    record: Annotated[
        bool, typer.Option(help="record the checksums of the files as they are now (only for files known sound)")
    ] = False,
) -> None:
    """Check a datastore: every checksum block of every file, SQLite's integrity, keys. Exit status 1 on damage."""
    from bertknn.index import faiss_files, retrieval
    from bertknn.store import verify as checks
    from bertknn.store.shards import directories

    paths = directories(datastore)
    if record:
        for path in paths:
            checks.record_checksums(path)
    found = checks.Report([], [])
    with phase_progress() as report:
        for path in paths:
            one = checks.verify(
                path,
                progress=lambda done, total: report("verifying", done, total),
                readers=(retrieval.problems, faiss_files.problems),
            )
            found.problems += one.problems
            found.notes += one.notes
            found.blocks += one.blocks
    for note in found.notes:
        console.print(f"[yellow]note:[/] {shown(note)}")
    for problem in found.problems:
        console.print(f"[bold red]damaged:[/] {shown(problem)}")
    if found.problems:
        raise typer.Exit(1)
    console.print(f"{shown(str(datastore))}: sound ({found.blocks:,} checksum blocks checked)")


@command(
    interrupted="what was rebuilt is committed; rerun the same command to finish {datastore}",
    example="bertknn repair my_store",
)
def repair(datastore: DatastoreArg, wait: WaitOption = CLI_WAIT_S) -> None:
    """Rebuild a datastore's damaged index files (TF-IDF segments, FAISS index) from the documents and keys it keeps,
    after the checks of `bertknn verify`, under the writer lock. Damage to what it keeps (keys, values, documents,
    store.sqlite, the manifest) is refused, exit status 2, with nothing written: the error says how to rebuild."""
    from bertknn.ingest.repair import Unrepairable
    from bertknn.ingest.repair import repair as repair_datastore

    try:
        with _writer_wait(datastore, wait), phase_progress() as report:
            done = repair_datastore(datastore, report)
    except Unrepairable as err:
        for problem in err.problems:
            console.print(f"[bold red]damaged:[/] {shown(problem)}")
        raise
    for note in done.notes:
        console.print(f"[yellow]note:[/] {shown(note)}")
    for line in done.rebuilt:
        console.print(f"[green]rebuilt:[/] {shown(line)}")
    if done.rebuilt:
        console.print(f"{shown(str(datastore))}: repaired ({len(done.rebuilt)} part(s)); `bertknn verify` checks it")
    else:
        console.print(f"{shown(str(datastore))}: sound, nothing needs repair ({done.blocks:,} checksum blocks checked)")
