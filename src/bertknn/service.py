"""HTTP service and web page over a `BertKNN`: `create_app(knn)` gives the FastAPI app that `bertknn serve` runs.

Every question runs on one worker thread (`MicroBatcher`), which first takes in what any process committed to the
datastore (`BertKNN.refresh`: documents added or removed by `bertknn add` or by this service, a new FAISS index).
/predict requests that wait together with the same settings are answered by one `predict_batch` call: one forward
pass instead of one per request. Writes run outside the questions' lock, on their own connection to the datastore,
under its cross-process writer lock: an add embeds while questions go on, and becomes visible when it is published.

Safe to expose: writes can require a bearer token, the Host header is checked (TrustedHostMiddleware), request
bodies, documents and the time a prediction may take are limited, malformed requests get a 4xx (never a 5xx),
neither /health nor an error's detail names a path on the server, and /docs loads nothing from outside.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import queue
import socket
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any

import swagger_ui_bundle
from fastapi import Depends, FastAPI, HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from starlette.datastructures import Headers
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import bertknn
from bertknn.atomic import DiskFullError
from bertknn.combine import Prediction
from bertknn.datastore import BusyError, Datastore, DatastoreError, file_sha256
from bertknn.demo import DEMO_CORPUS, demo_questions
from bertknn.encoder import QuestionError
from bertknn.pipeline import BertKNN, Query
from bertknn.settings import LAM_RULES, MIXTURES, RETRIEVALS, Settings
from bertknn.shards import Store, is_sharded, open_store
from bertknn.text import MASK, Document, parse_document, unicode_error

WEB_DIR = Path(str(files("bertknn") / "web"))
SWAGGER_DIR = Path(swagger_ui_bundle.swagger_ui_path)
DOCS_ASSETS = "/docs-assets"
MAX_TEXT = 1000
MAX_BATCH = 64
MAX_N_DOCS = 100
MAX_K = 10_000
MAX_BODY_BYTES = 1 << 20
MAX_DOCUMENT_CHARS = 20_000
REQUEST_TIMEOUT_S = 30.0
WRITE_WAIT_S = 20.0  # how long a write waits for another writer (another process, or this service) before 503
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
TOKEN_ENV = "BERTKNN_TOKEN"
GENERIC_EXAMPLES = [
    {"question": "Paris is the capital of [MASK] .", "subject": "Paris"},
    {"question": "Dante was born in [MASK] .", "subject": "Dante Alighieri"},
    {"question": "The cello is a [MASK] instrument .", "subject": None},
]
READ_ONLY = "read-only datastore: start the server with `bertknn serve DIR --writable` to add or remove documents"
UNAUTHORIZED = (
    f"missing or wrong token: send the header `Authorization: Bearer TOKEN` with the token the server was started "
    f"with (`bertknn serve --token` or {TOKEN_ENV})"
)
BEARER = HTTPBearer(auto_error=False, description=f"the token given to `bertknn serve --token` or {TOKEN_ENV}")


def _utf8(value: Any) -> Any:
    """`value` if UTF-8 can encode its strings (it, or a list's items): a lone surrogate, from a JSON escape such
    as "\\ud800", is refused."""
    for item in value if isinstance(value, list) else [value]:
        error = unicode_error(item) if isinstance(item, str) else None
        if error:
            raise ValueError(error)
    return value


UTF8 = AfterValidator(_utf8)  # on a whole field, so that errors name the field, not a member of its union
Text = Annotated[
    str, Field(min_length=1, max_length=MAX_TEXT, description=f"cloze question with exactly one {MASK}"), UTF8
]
Subject = Annotated[
    str | None,
    Field(default=None, max_length=300, description="subject: a document with this title is searched"),
    UTF8,
]
TopK = Annotated[int, Field(default=10, ge=1, le=100, description="answers per ranking")]
EvidenceCount = Annotated[int, Field(default=3, ge=0, le=20, description="evidence sentences per kNN answer")]


class Options(BaseModel):
    """Per-request settings; unset ones keep the server's (the datastore's tuned values or bertknn's defaults)."""

    model_config = ConfigDict(extra="forbid")
    n_docs: int | None = Field(default=None, ge=1, le=MAX_N_DOCS, description="documents retrieved")
    k: int | None = Field(default=None, ge=1, le=MAX_K, description="nearest neighbours")
    temperature: float | None = Field(default=None, allow_inf_nan=False, description="l in exp(-d/l)")
    lam: float | None = Field(default=None, allow_inf_nan=False, description="weight of p_kNN in [0, 1]")
    retrieval: Annotated[str, WithJsonSchema({"type": "string", "enum": list(RETRIEVALS)})] | None = Field(
        default=None,  # checked by Settings (`_checked`), so the message is the library's
        description="neighbours from IR documents (default), the whole datastore's FAISS index, or both",
    )
    doc_temperature: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="retrieval-aware kNN vote: p(d|q) = softmax of retrieval scores over this; 0: the paper's vote",
    )
    lam_by: Annotated[str, WithJsonSchema({"type": "string", "enum": list(LAM_RULES)})] | None = Field(
        default=None, description="lambda per question: constant (the paper) or entropy (by the kNN's confidence)"
    )
    mixture: Annotated[str, WithJsonSchema({"type": "string", "enum": list(MIXTURES)})] | None = Field(
        default=None, description="p_kNN and the LM's p combined: linear (the paper) or log-linear"
    )
    lm_words: int | None = Field(
        default=None,
        ge=0,
        le=MAX_K,
        description="the LM scores the answers of several tokens among the kNN's this many best words; 0: all",
    )
    word_bonus: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="the log-linear mixture's factor for answers of several tokens; 1: none",
    )
    sentence_temperature: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="weigh each neighbour by exp(cos / this), cos its sentence's similarity to the question; 0: none",
    )


FillMask = Annotated[
    bool, Field(default=False, description="also give each ranking as transformers' fill-mask pipeline does")
]


class PredictRequest(BaseModel):
    """One cloze question."""

    model_config = ConfigDict(extra="forbid")
    text: Text
    subject: Subject
    top_k: TopK
    evidence: EvidenceCount
    options: Options | None = None
    fill_mask: FillMask


class Question(BaseModel):
    """A question of a batch."""

    model_config = ConfigDict(extra="forbid")
    text: Text
    subject: Subject


class BatchRequest(BaseModel):
    """Up to 64 cloze questions answered with the same settings."""

    model_config = ConfigDict(extra="forbid")
    questions: list[Question] = Field(min_length=1, max_length=MAX_BATCH)
    top_k: TopK
    evidence: EvidenceCount
    options: Options | None = None
    fill_mask: FillMask


Passage = Annotated[str, Field(max_length=100_000)]


class DocumentIn(BaseModel):
    """A document to add: the corpus format's {id, title, text}, checked by the corpus reader's rules."""

    model_config = ConfigDict(extra="forbid")
    id: Annotated[
        Any,  # as sent: `parse_document` decides, so that `true` or 1.5 is refused as in a corpus file
        WithJsonSchema({"anyOf": [{"type": "string", "minLength": 1}, {"type": "integer"}]}),
        Field(description="a string or a 64-bit integer, unique in the datastore"),
    ]
    title: Annotated[str, Field(min_length=1, max_length=1000), UTF8]
    text: Annotated[Passage | Annotated[list[Passage], Field(min_length=1, max_length=1000)], UTF8] = Field(
        description="the text, or a list of passages"
    )

    @model_validator(mode="after")
    def _readable(self) -> DocumentIn:
        self.document()
        return self

    def document(self) -> Document:
        """The document as `bertknn add` reads it from a corpus file (`text.parse_document`; CorpusError)."""
        return parse_document(self.model_dump(), "the document")


class TokenScoreOut(BaseModel):
    """An answer word, its probability, its id and its tokens."""

    token: str = Field(description="the word")
    probability: float
    id: int = Field(
        description="the word's id: its id in the model's vocabulary for a word of one token, else its number in the "
        "datastore's lexicon (from the vocabulary's size on)"
    )
    pieces: list[int] = Field(description="the ids of the word's tokens in the model's vocabulary")


class NeighbourOut(BaseModel):
    """A stored context near the question, with its sentence and the word's span there."""

    token: str
    distance: float = Field(description="squared L2 distance to the question's state")
    weight: float
    doc_id: str
    title: str
    sentence: str
    span: tuple[int, int] = Field(description="[start, end) of the word in `sentence`, in characters")


class FillMaskOut(BaseModel):
    """An answer in the format of transformers' fill-mask pipeline."""

    score: float
    token: int | list[int] = Field(description="the token's id; for a word of several tokens, the list of their ids")
    token_str: str
    sequence: str = Field(description="the question with its mask filled")


class PredictionOut(BaseModel):
    """BERT's, kNN's and BERT-kNN's rankings, and the evidence behind the kNN answers."""

    question: str
    subject: str | None
    documents: list[str] = Field(description="titles of the documents searched")
    retrieval: str = Field(description="where the neighbours came from: ir, faiss or ir+faiss")
    bert: list[TokenScoreOut]
    knn: list[TokenScoreOut]
    bert_knn: list[TokenScoreOut]
    evidence: dict[str, list[NeighbourOut]] = Field(description="for each kNN answer, its nearest stored contexts")
    fill_mask: dict[str, list[FillMaskOut]] | None = Field(
        default=None, description="with fill_mask: the rankings (bert, knn, bert_knn) as the fill-mask pipeline's"
    )


class BatchOut(BaseModel):
    """The answers of a batch, in question order."""

    predictions: list[PredictionOut]


class DocumentOut(BaseModel):
    """A document added (201), or found there already with the same text (200), and the datastore's counts."""

    id: str
    contexts_added: int
    already_there: bool = Field(description="the same document (id and text) was there: nothing was added")
    message: str
    documents: int
    contexts: int


class Example(BaseModel):
    """An example question for the page."""

    question: str
    subject: str | None


@dataclass
class _Job:
    queries: list[Query]
    settings: tuple[int, int, Settings]  # (top_k, evidence, settings): jobs with equal ones share a predict_batch call
    future: Future = field(default_factory=Future)


class MicroBatcher:
    """One worker thread that runs every prediction; jobs waiting together with the same settings share one call.

    The worker takes the oldest job, then everything else waiting (up to `max_batch` jobs, waiting at most
    `window_ms` for more), groups the jobs by settings and calls `predict_batch` once per group. `max_batch=1`
    answers one request at a time. When a merged call fails, its jobs are retried one by one, so a bad request
    fails alone.
    """

    def __init__(self, knn: BertKNN, lock: threading.Lock, max_batch: int = 32, window_ms: float = 0.0) -> None:
        if max_batch < 1 or window_ms < 0:
            raise ValueError(f"max_batch must be >= 1 and window_ms >= 0 (got {max_batch}, {window_ms})")
        self.knn, self.lock, self.max_batch, self.window = knn, lock, max_batch, window_ms / 1000
        self.queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.calls = 0  # predict_batch calls made, for /health

    def submit(self, queries: list[Query], top_k: int, evidence: int, settings: Settings) -> Future:
        """Queue questions (`BertKNN.preprocess`); the future's result is their list of `Prediction`s."""
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="bertknn-model", daemon=True)
                self._thread.start()
        job = _Job(queries, (top_k, evidence, settings))
        self.queue.put(job)
        return job.future

    def close(self) -> None:
        """Stop the worker after the jobs already queued."""
        with self._start_lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self.queue.put(None)
            thread.join()

    def _take(self, first: _Job) -> list[_Job]:
        jobs, deadline = [first], time.monotonic() + self.window
        while len(jobs) < self.max_batch:
            try:
                job = (
                    self.queue.get(timeout=max(deadline - time.monotonic(), 0))
                    if self.window
                    else self.queue.get_nowait()
                )
            except queue.Empty:
                break
            if job is None:  # close(): finish this round, then stop
                self.queue.put(None)
                break
            jobs.append(job)
        return [job for job in jobs if job.future.set_running_or_notify_cancel()]  # drop requests given up on

    def _run(self) -> None:
        while (first := self.queue.get()) is not None:
            groups: dict[tuple, list[_Job]] = {}
            for job in self._take(first):
                groups.setdefault(job.settings, []).append(job)
            for group in groups.values():
                self._answer(group)

    def _answer(self, group: list[_Job]) -> None:
        top_k, evidence, settings = group[0].settings
        queries = [q for job in group for q in job.queries]
        try:
            with self.lock:
                self.calls += 1
                self.knn.refresh()
                predictions = self.knn.predict_batch(queries, None, top_k, evidence, settings=settings)
        except Exception as err:
            if len(group) > 1:
                for job in group:
                    self._answer([job])
            else:
                group[0].future.set_exception(err)
            return
        start = 0
        for job in group:
            job.future.set_result(predictions[start : start + len(job.queries)])
            start += len(job.queries)


def _error_response(err: HTTPException) -> JSONResponse:
    return JSONResponse({"detail": err.detail}, status_code=err.status_code, headers=err.headers)


class BodyTooLarge(HTTPException):
    """A request body over the limit (413)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(
            status.HTTP_413_CONTENT_TOO_LARGE, detail=f"request body over the limit of {max_bytes:,} bytes"
        )


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` gets 413, refused by its Content-Length before it is read,
    or as soon as a streamed (chunked) body passes the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length", "")
        if length.isascii() and length.isdigit() and int(length) > self.max_bytes:
            await _error_response(BodyTooLarge(self.max_bytes))(scope, receive, send)
            return
        received, started = 0, False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise BodyTooLarge(self.max_bytes)  # FastAPI answers it; otherwise the except below does
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except BodyTooLarge as err:
            if started:
                raise
            await _error_response(err)(scope, receive, send)


def _encodable(value: object) -> str | int:
    """A location part or message that JSON in UTF-8 can carry: lone surrogates become backslash escapes."""
    return value if isinstance(value, int) else str(value).encode("utf-8", "backslashreplace").decode()


async def _validation_error(_: Request, err: RequestValidationError) -> JSONResponse:
    """422 with each error's loc, msg and type only: the input and context FastAPI would echo may not be JSON
    (NaN, infinity) or not encodable (lone surrogates), which made its own handler fail with a 500."""
    errors = [
        {"loc": [_encodable(part) for part in e["loc"]], "msg": _encodable(e["msg"]), "type": _encodable(e["type"])}
        for e in err.errors()
    ]
    return JSONResponse({"detail": errors}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server on this machine: localhost, 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts_for(host: str) -> list[str]:
    """The Host names a server bound to `host` answers: the loopback names, plus for a network bind that address
    and this machine's names and addresses."""
    if is_loopback(host):
        return list(LOOPBACK_NAMES)
    names = {host, socket.gethostname(), socket.getfqdn()}
    with contextlib.suppress(OSError):
        names.update(socket.gethostbyname_ex(socket.gethostname())[2])
    return [*LOOPBACK_NAMES, *sorted(names - set(LOOPBACK_NAMES))]


def _host_patterns(hosts: list[str]) -> list[str]:
    """`hosts` as TrustedHostMiddleware matches them: IPv6 literals in brackets, as they stand in a Host header."""
    return [f"[{h.strip('[]')}]" if ":" in h else h for h in hosts]


def _document_chars(doc: DocumentIn) -> int:
    passages = [doc.text] if isinstance(doc.text, str) else doc.text
    return len(doc.title) + sum(len(p) for p in passages)


def _public_name(name: str | Path) -> str:
    """A model or datastore as /health shows it: a path's last part only (relative or not), never where it lies on
    the server; a model hub name that is no local path stays as it is."""
    path = Path(name)
    return path.resolve().name if path.is_absolute() or path.exists() else str(name)


def _public(message: str, store: Store) -> str:
    """An error message for a client: the datastore's directory (as given and absolute, and so its shards' and files'
    paths too) written as its name."""
    name = _public_name(store.path)
    given = [str(store.path)] if len(store.path.parts) > 1 else []  # a bare name is shown as it is
    for path in sorted({str(store.path.resolve()), *given}, key=len, reverse=True):
        message = message.replace(path, name)
    return message


def _full(err: DiskFullError, store: Store) -> HTTPException:
    """507 for a write the datastore's disk had no room for: nothing was changed, and a retry after space was freed
    finishes it."""
    return HTTPException(status.HTTP_507_INSUFFICIENT_STORAGE, detail=_public(str(err), store))


def _unprocessable(message: str) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=message)


def _checked(knn: BertKNN, questions: list[Question], options: Options | None) -> tuple[list[Query], Settings]:
    """The request's questions encoded (`BertKNN.preprocess`) and its settings (the server's with its options), both
    checked before they reach the model (422 otherwise): a bad question fails its own request only."""
    try:
        queries = knn.preprocess([q.text for q in questions], [q.subject for q in questions])
    except QuestionError as err:
        error, i = str(err.__cause__ or err), err.index
        raise _unprocessable(error if len(questions) == 1 else f"question {i + 1}: {error}") from None
    try:
        settings = knn.settings.replace(**(options.model_dump(exclude_none=True) if options else {}))
    except (ValueError, TypeError) as err:
        raise _unprocessable(str(err)) from None
    if settings.retrieval != "ir" and knn.faiss is None:
        raise _unprocessable("this datastore has no FAISS index: create one with `bertknn index DIR`")
    return queries, settings


async def _predict(
    batcher: MicroBatcher, checked: tuple[list[Query], Settings], req: PredictRequest | BatchRequest, timeout_s: float
) -> list:
    """The questions' predictions as dicts (with the fill-mask format if asked); 503 when they are not ready within
    `timeout_s` (the job is then cancelled, so the worker skips it unless it has started)."""
    queries, settings = checked
    future = batcher.submit(queries, req.top_k, req.evidence, settings)
    try:
        predictions: list[Prediction] = await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
    except (ValueError, TypeError) as err:  # QuestionError (e.g. a [MASK] past the model's input length) included
        raise _unprocessable(_public(str(err), batcher.knn.store)) from None
    except asyncio.TimeoutError:
        future.cancel()
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            detail=f"no answer within the server's time limit of {timeout_s:g} s: it is busy, try again later",
        ) from None
    return [p.to_dict(batcher.knn.encoder.tokenizer if req.fill_mask else None) for p in predictions]


def _is_demo(knn: BertKNN) -> bool:
    corpus = knn.store.manifest.get("corpus") or {}
    return corpus.get("sha256") == file_sha256(DEMO_CORPUS)


def create_app(
    knn: BertKNN,
    writable: bool = False,
    max_batch: int = 32,
    batch_window_ms: float = 0.0,
    token: str | None = None,
    allowed_hosts: list[str] | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_document_chars: int = MAX_DOCUMENT_CHARS,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
) -> FastAPI:
    """The HTTP API and web page over `knn`.

    `writable` enables POST /documents and DELETE /documents/{id} (403 otherwise); with a `token` they also need
    `Authorization: Bearer <token>` (401 otherwise). `allowed_hosts` are the Host header values answered (400
    otherwise; default: the loopback names). A request body over `max_body_bytes` gets 413, and so does a document
    over `max_document_chars` (title and text together); a prediction not ready within `request_timeout_s` gets 503.
    `max_batch` caps how many waiting /predict requests share one model call (1 turns micro-batching off);
    `batch_window_ms` is how long the worker waits for more requests once it has one.
    """
    if token is not None and not token:
        raise ValueError("the token must not be empty")
    lock = threading.Lock()
    batcher = MicroBatcher(knn, lock, max_batch, batch_window_ms)
    examples = (
        [{"question": q["question"], "subject": q["subject"]} for q in demo_questions()]
        if _is_demo(knn)
        else GENERIC_EXAMPLES
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(batcher.close)

    app = FastAPI(
        title="bertknn",
        version=bertknn.__version__,
        description="BERT-kNN: a masked LM answers cloze questions together with a nearest-neighbour search over a "
        "datastore of word contexts, and shows the evidence sentences.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.batcher = batcher
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=_host_patterns(allowed_hosts or list(LOOPBACK_NAMES)))
    expected = token.encode() if token else b""

    def require_token(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]) -> None:
        given = credentials.credentials.encode("latin-1") if credentials else b""  # header bytes as sent
        if not hmac.compare_digest(given, expected):
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED, detail=UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"}
            )

    def require_writable() -> None:
        if not writable:
            raise HTTPException(status.HTTP_403_FORBIDDEN, detail=READ_ONLY)

    write_checks = [Depends(require_token), Depends(require_writable)] if token else [Depends(require_writable)]
    writers: list[BertKNN] = []  # the one BertKNN that writes, opened on first use
    writer_lock = threading.Lock()

    def writer() -> BertKNN:
        """A BertKNN over its own connection to the datastore (sharing the model): documents are embedded there
        while questions go on; the question side takes the commit in through `refresh`."""
        with writer_lock:
            if not writers:
                path = knn.store.path.resolve()  # its errors name it whole, so `_public` finds it
                store = open_store(path) if is_sharded(path) else Datastore(path, check=False)
                writers.append(BertKNN(knn.encoder, store, settings=knn.settings))
            return writers[0]

    @app.post(
        "/predict", response_model=PredictionOut, response_model_exclude_unset=True, summary="Answer one cloze question"
    )
    async def predict(req: PredictRequest) -> dict:
        """BERT's, kNN's and BERT-kNN's rankings with probabilities, and the evidence behind the kNN answers."""
        checked = _checked(knn, [Question(text=req.text, subject=req.subject)], req.options)
        return (await _predict(batcher, checked, req, request_timeout_s))[0]

    @app.post(
        "/predict/batch",
        response_model=BatchOut,
        response_model_exclude_unset=True,
        summary="Answer up to 64 cloze questions",
    )
    async def predict_batch(req: BatchRequest) -> dict:
        """The /predict answer for each question, in order, from one model call."""
        checked = _checked(knn, req.questions, req.options)
        answers = await _predict(batcher, checked, req, request_timeout_s)
        return {"predictions": answers}

    @app.post(
        "/documents",
        response_model=DocumentOut,
        status_code=status.HTTP_201_CREATED,
        dependencies=write_checks,
        summary="Add a document (--writable only)",
        responses={200: {"model": DocumentOut, "description": "The same document was there already"}},
    )
    def add_document(doc: DocumentIn, response: Response) -> dict:
        """Embed a document's words into the datastore: its facts become answerable at once. Adding the same
        document (id and text) again changes nothing (200), as `bertknn add` does; the same id with other text is
        a conflict (409)."""
        if (chars := _document_chars(doc)) > max_document_chars:
            raise HTTPException(
                status.HTTP_413_CONTENT_TOO_LARGE,
                detail=f"the document has {chars:,} characters; the limit is {max_document_chars:,} characters "
                "(title and text together)",
            )
        document, knn_writer = doc.document(), writer()
        store = knn_writer.store
        try:
            with store.writing(WRITE_WAIT_S):  # nobody adds or removes it between the look and the add
                there = store.states([document.id]).get(document.id) == "live"  # other text: a conflict below
                added = knn_writer.add_documents([document], skip_existing=there, wait=WRITE_WAIT_S)
        except BusyError as err:
            raise _busy(err, store) from None
        except DiskFullError as err:
            raise _full(err, store) from None
        except DatastoreError as err:
            raise HTTPException(status.HTTP_409_CONFLICT, detail=_public(str(err), store)) from None
        if there:
            response.status_code = status.HTTP_200_OK
        message = (
            f"document {document.id!r} was there already (same id and text): nothing was added"
            if there
            else f"added document {document.id!r} ({added:,} contexts)"
        )
        counts = _counts(knn, lock)
        return {"id": document.id, "contexts_added": added, "already_there": there, "message": message, **counts}

    @app.delete(
        "/documents/{doc_id:path}",
        dependencies=write_checks,
        summary="Remove a document (--writable only)",
    )
    def remove_document(doc_id: str) -> dict:
        """Remove a document from every search."""
        knn_writer = writer()
        store = knn_writer.store
        try:
            knn_writer.remove_document(doc_id, wait=WRITE_WAIT_S)
        except BusyError as err:
            raise _busy(err, store) from None
        except DiskFullError as err:
            raise _full(err, store) from None
        except DatastoreError as err:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=_public(str(err), store)) from None
        return {"id": doc_id, "removed": True, **_counts(knn, lock)}

    @app.get("/health", summary="Model, datastore and counts")
    def health() -> dict:
        """Liveness plus what is being served."""
        return {
            "status": "ok",
            "model": _public_name(knn.encoder.name),
            "layer": knn.store.layer,
            "datastore": _public_name(knn.store.path),
            **_counts(knn, lock),
            "hparams": knn.settings.hparams,
            "settings": knn.settings.as_dict(),  # also the vote, the mixture and the lambda rule a request gets
            "writable": writable,
            "max_batch": batcher.max_batch,
            "model_calls": batcher.calls,
        }

    @app.get("/examples", response_model=list[Example], summary="Example questions for the page")
    def get_examples() -> list[dict]:
        """The demo's questions when serving the demo datastore, otherwise a few generic ones."""
        return examples

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

    app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")
    app.mount(DOCS_ASSETS, StaticFiles(directory=SWAGGER_DIR), name="docs-assets")
    return app


def _counts(knn: BertKNN, lock: threading.Lock) -> dict:
    with lock:
        knn.refresh()
        return {"documents": knn.store.live_documents(), "contexts": knn.store.size}


def _busy(err: BusyError, store: Store) -> HTTPException:
    return HTTPException(
        status.HTTP_503_SERVICE_UNAVAILABLE, detail=_public(str(err), store), headers={"Retry-After": "5"}
    )
