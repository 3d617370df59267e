"""HTTP service and web page over a `BertKNN`: `create_app(reader)` gives the FastAPI app that `bertknn serve` runs.

Every question runs on one worker thread (`batching.MicroBatcher`), which first takes in what any process committed
to the datastore (`BertKNN.refresh`: documents added or removed by `bertknn add` or by this service, a new FAISS
index). /predict requests that wait together with the same settings are answered by one `predict_batch` call: one
forward pass instead of one per request. Writes run outside the questions' lock, through a `Writer` on its own
connection to the datastore, under its cross-process writer lock: an add embeds while questions go on, and becomes
visible when it is published.

Safe to expose (`security`): writes can require a bearer token, the Host header is checked (TrustedHostMiddleware),
request bodies, documents and the time a prediction may take are limited (`schemas`), malformed requests get a 4xx
(never a 5xx), neither /health nor an error's detail names a path on the server (`errors`), and /docs loads nothing
from outside.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from importlib.resources import files
from pathlib import Path

import swagger_ui_bundle
from fastapi import FastAPI, HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.middleware.trustedhost import TrustedHostMiddleware

import bertknn
from bertknn.demo import DEMO_CORPUS, demo_questions
from bertknn.ingest.ingester import Writer
from bertknn.model.encoder import QuestionError
from bertknn.query.pipeline import BertKNN, Query
from bertknn.query.prediction import Prediction
from bertknn.query.search import ShardUnavailable
from bertknn.query.settings import Settings
from bertknn.serving.batching import MicroBatcher
from bertknn.serving.http_errors import (
    public,
    public_name,
    unavailable,
    unprocessable,
    validation_error,
    write_errors,
)
from bertknn.serving.schemas import (
    MAX_BODY_BYTES,
    MAX_DOCUMENT_CHARS,
    REQUEST_TIMEOUT_S,
    BatchOut,
    BatchRequest,
    DocumentIn,
    DocumentOut,
    Example,
    Options,
    PredictionOut,
    PredictRequest,
    Question,
    document_chars,
)
from bertknn.serving.security import LOOPBACK_NAMES, BodyLimit, host_patterns, write_checks
from bertknn.store.datastore import file_sha256
from bertknn.store.lock import SERVICE_WAIT_S
from bertknn.store.shards import open_store
from bertknn.text import Document

WEB_DIR = Path(str(files("bertknn") / "web"))
SWAGGER_DIR = Path(swagger_ui_bundle.swagger_ui_path)
DOCS_ASSETS = "/docs-assets"
GENERIC_EXAMPLES = [
    {"question": "Paris is the capital of [MASK] .", "subject": "Paris"},
    {"question": "Dante was born in [MASK] .", "subject": "Dante Alighieri"},
    {"question": "The cello is a [MASK] instrument .", "subject": None},
]


def create_app(
    reader: BertKNN,
    writable: bool = False,
    max_batch: int = 32,
    batch_window_ms: float = 0.0,
    token: str | None = None,
    allowed_hosts: list[str] | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_document_chars: int = MAX_DOCUMENT_CHARS,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
) -> FastAPI:
    """The HTTP API and web page over `reader`.

    `writable` enables POST /documents and DELETE /documents/{id} (403 otherwise); with a `token` they also need
    `Authorization: Bearer <token>` (401 otherwise). `allowed_hosts` are the Host header values answered (400
    otherwise; default: the loopback names). A request body over `max_body_bytes` gets 413, and so does a document
    over `max_document_chars` (title and text together); a prediction not ready within `request_timeout_s` gets 503.
    `max_batch` caps how many waiting /predict requests share one model call (1 turns micro-batching off);
    `batch_window_ms` is how long the worker waits for more requests once it has one.
    """
    checks = write_checks(writable, token)  # ValueError for an empty token
    lock = threading.Lock()
    batcher = MicroBatcher(reader, lock, max_batch, batch_window_ms)
    app = _app(batcher)
    app.state.batcher = batcher
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=host_patterns(allowed_hosts or list(LOOPBACK_NAMES)))
    _add_question_routes(app, batcher, request_timeout_s)
    _add_document_routes(app, _Writes(reader, lock), checks, max_document_chars)
    _add_info_routes(app, batcher, writable)
    _add_page_routes(app)
    app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")
    app.mount(DOCS_ASSETS, StaticFiles(directory=SWAGGER_DIR), name="docs-assets")
    return app


def _app(batcher: MicroBatcher) -> FastAPI:
    """The app with its OpenAPI title and description, no docs of FastAPI's own (`_add_page_routes` serves /docs), and a
    lifespan that stops the batcher's worker at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(batcher.close)

    return FastAPI(
        title="bertknn",
        version=bertknn.__version__,
        description="BERT-kNN: a masked LM answers cloze questions together with a nearest-neighbour search over a "
        "datastore of word contexts, and shows the evidence sentences.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )


def _add_question_routes(app: FastAPI, batcher: MicroBatcher, timeout_s: float) -> None:
    """POST /predict and /predict/batch, answered by `batcher`'s worker."""

    @app.post(
        "/predict", response_model=PredictionOut, response_model_exclude_unset=True, summary="Answer one cloze question"
    )
    async def predict(req: PredictRequest) -> dict:
        """BERT's, kNN's and BERT-kNN's rankings with probabilities, and the evidence behind the kNN answers."""
        checked = _checked(batcher.reader, [Question(text=req.text, subject=req.subject)], req.options)
        return (await _predict(batcher, checked, req, timeout_s))[0]

    @app.post(
        "/predict/batch",
        response_model=BatchOut,
        response_model_exclude_unset=True,
        summary="Answer up to 64 cloze questions",
    )
    async def predict_batch(req: BatchRequest) -> dict:
        """The /predict answer for each question, in order, from one model call."""
        checked = _checked(batcher.reader, req.questions, req.options)
        answers = await _predict(batcher, checked, req, timeout_s)
        return {"predictions": answers}


def _checked(reader: BertKNN, questions: list[Question], options: Options | None) -> tuple[list[Query], Settings]:
    """The request's questions encoded (`BertKNN.preprocess`) and its settings (the server's with its options), both
    checked before they reach the model (422 otherwise): a bad question fails its own request only."""
    try:
        queries = reader.preprocess([q.text for q in questions], [q.subject for q in questions])
    except QuestionError as err:
        error, i = str(err.__cause__ or err), err.index
        raise unprocessable(error if len(questions) == 1 else f"question {i + 1}: {error}") from None
    try:
        settings = reader.settings.replace(**(options.model_dump(exclude_none=True) if options else {}))
    except (ValueError, TypeError) as err:
        raise unprocessable(str(err)) from None
    if settings.retrieval != "ir" and reader.faiss is None:
        raise unprocessable("this datastore has no FAISS index: create one with `bertknn index DIR`")
    return queries, settings


async def _predict(
    batcher: MicroBatcher, checked: tuple[list[Query], Settings], req: PredictRequest | BatchRequest, timeout_s: float
) -> list:
    """The questions' predictions as dicts (with the fill-mask format if asked); 503 when they are not ready within
    `timeout_s` (the job is then cancelled, so the worker skips it unless it has started) or a shard served elsewhere
    did not answer."""
    queries, settings = checked
    future = batcher.submit(queries, req.top_k, req.evidence, settings)
    try:
        predictions: list[Prediction] = await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
    except (ValueError, TypeError) as err:  # QuestionError (e.g. a [MASK] past the model's input length) included
        raise unprocessable(public(str(err), batcher.reader.store)) from None
    except asyncio.TimeoutError:
        future.cancel()
        late = f"no answer within the server's time limit of {timeout_s:g} s: it is busy, try again later"
        raise unavailable(late) from None
    except ShardUnavailable as err:
        raise unavailable(str(err)) from None
    return [p.to_dict(batcher.reader.encoder.tokenizer if req.fill_mask else None) for p in predictions]


class _Writes:
    """The service's write side: a `Writer` over its own connection to the datastore, sharing the reader's model,
    opened on first use. Documents are embedded there while questions go on; the reader takes the commit in through
    `refresh` (`counts`, and the worker before each call)."""

    def __init__(self, reader: BertKNN, lock: threading.Lock) -> None:
        self.reader, self.lock = reader, lock
        self._writer: Writer | None = None
        self._opening = threading.Lock()

    def writer(self) -> Writer:
        with self._opening:
            if self._writer is None:
                path = self.reader.store.path.resolve()  # its errors name it whole, so `http_errors.public` finds it
                store = open_store(path, check=False)
                self._writer = Writer(store, self.reader.encoder)
            return self._writer

    def add(self, document: Document) -> tuple[int, bool]:
        """Add `document`: (contexts added, whether the same document was there, so that nothing was added). 503 when
        another writer holds the datastore too long, 507 for a full disk, 409 for its id there with other text."""
        writer = self.writer()
        with write_errors(writer.store, status.HTTP_409_CONFLICT):  # the id there with other text: a conflict
            added = writer.add_documents([document], skip_existing=True, wait=SERVICE_WAIT_S)
            return added, document.id in writer.staged.unchanged

    def remove(self, doc_id: str) -> None:
        """Remove a document: 503 and 507 as for `add`, 404 for an id not there."""
        writer = self.writer()
        with write_errors(writer.store, status.HTTP_404_NOT_FOUND):
            writer.remove_document(doc_id, wait=SERVICE_WAIT_S)

    def counts(self) -> dict:
        """The datastore's live documents and contexts, as the reader sees them once it took in the writes."""
        return _counts(self.reader, self.lock)


class _DocIdConvertor(PathConvertor):
    """A document id in a URL path: any characters, "/" and line breaks included. Starlette's `path` stops at a
    newline (and its "$" lets a trailing one go), yet the corpus reader takes tabs and newlines in ids: without this
    a document added with such an id could not be removed, or another one's id would be removed instead."""

    regex = "(?s:.*)"


register_url_convertor("doc_id", _DocIdConvertor())


def _add_document_routes(app: FastAPI, writes: _Writes, checks: list, max_document_chars: int) -> None:
    """POST /documents and DELETE /documents/{id}, behind `checks` (`security.write_checks`)."""

    @app.post(
        "/documents",
        response_model=DocumentOut,
        status_code=status.HTTP_201_CREATED,
        dependencies=checks,
        summary="Add a document (--writable only)",
        responses={200: {"model": DocumentOut, "description": "The same document was there already"}},
    )
    def add_document(doc: DocumentIn, response: Response) -> dict:
        """Embed a document's words into the datastore: its facts become answerable at once. Adding the same
        document (id and text) again changes nothing (200), as `bertknn add` does; the same id with other text is
        a conflict (409)."""
        if (chars := document_chars(doc)) > max_document_chars:
            raise HTTPException(
                status.HTTP_413_CONTENT_TOO_LARGE,
                detail=f"the document has {chars:,} characters; the limit is {max_document_chars:,} characters "
                "(title and text together)",
            )
        document = doc.document()
        added, there = writes.add(document)
        if there:
            response.status_code = status.HTTP_200_OK
        message = (
            f"document {document.id!r} was there already (same id and text): nothing was added"
            if there
            else f"added document {document.id!r} ({added:,} contexts)"
        )
        counts = writes.counts()
        return {"id": document.id, "contexts_added": added, "already_there": there, "message": message, **counts}

    @app.delete(
        "/documents/{doc_id:doc_id}",
        dependencies=checks,
        summary="Remove a document (--writable only)",
    )
    def remove_document(doc_id: str) -> dict:
        """Remove a document from every search."""
        writes.remove(doc_id)
        return {"id": doc_id, "removed": True, **writes.counts()}


def _add_info_routes(app: FastAPI, batcher: MicroBatcher, writable: bool) -> None:
    """GET /health and /examples."""
    reader = batcher.reader
    examples = (
        [{"question": q["question"], "subject": q["subject"]} for q in demo_questions()]
        if _is_demo(reader)
        else GENERIC_EXAMPLES
    )

    @app.get("/health", summary="Model, datastore and counts")
    def health() -> dict:
        """Liveness plus what is being served."""
        return {
            "status": "ok",
            "model": public_name(reader.encoder.name),
            "layer": reader.store.manifest.layer,
            "datastore": public_name(reader.store.path),
            **_counts(reader, batcher.lock),
            "hparams": reader.settings.hparams,
            "settings": reader.settings.as_dict(),  # also the vote, the mixture and the lambda rule a request gets
            "writable": writable,
            "max_batch": batcher.max_batch,
            "model_calls": batcher.calls,
        }

    @app.get("/examples", response_model=list[Example], summary="Example questions for the page")
    def get_examples() -> list[dict]:
        """The demo's questions when serving the demo datastore, otherwise a few generic ones."""
        return examples


def _add_page_routes(app: FastAPI) -> None:
    """GET / (the web page) and /docs (Swagger UI), both outside the OpenAPI schema."""

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(WEB_DIR / "index.html")

    @app.get("/docs", include_in_schema=False)
    def docs(request: Request) -> HTMLResponse:
        """Swagger UI from the files of the swagger-ui-bundle package: nothing is loaded from another site."""
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} API",
            swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon-32x32.png",
            swagger_ui_parameters={"validatorUrl": None},  # no badge from validator.swagger.io
        )


def _is_demo(reader: BertKNN) -> bool:
    corpus = reader.store.manifest.get("corpus") or {}
    return corpus.get("sha256") == file_sha256(DEMO_CORPUS)


def _counts(reader: BertKNN, lock: threading.Lock) -> dict:
    with lock:
        reader.refresh()
        return {"documents": reader.store.documents.count_live(), "contexts": reader.store.size}
