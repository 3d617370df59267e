"""The HTTP API's request and response models (pydantic: they make its OpenAPI schema) and the limits they and the
service enforce: question length, batch size, request settings, body and document size, time a prediction may take.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    WithJsonSchema,
    create_model,
    model_validator,
)
from pydantic_core import PydanticCustomError

from bertknn.query.settings import SPECS, TYPES
from bertknn.text import MASK, Document, parse_document, unicode_error

MAX_TEXT = 1000
MAX_BATCH = 64
MAX_N_DOCS = 100
MAX_K = 10_000
MAX_BODY_BYTES = 1 << 20
MAX_DOCUMENT_CHARS = 20_000
REQUEST_TIMEOUT_S = 30.0


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


def _number(value: Any) -> Any:
    """`value` if JSON calls it a number: pydantic's lax mode would take `true` as 1 and "5" as 5. A whole float such
    as 3.0 stays an integer, as JSON Schema's "integer" and `Settings` have it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


def strict(kind: type, *constraints: Any) -> Any:
    """`kind` with `constraints` (a Field's bounds), taking its own JSON type only (a boolean is no number, a string
    no boolean or number): an integer by `_number`, a boolean, string or float strictly (a float takes an integer).
    `_number` comes after the bounds, so that they stay the integer's own (its schema's minimum and maximum)."""
    if kind is int:
        return Annotated[(int, *constraints, BeforeValidator(_number))]
    return Annotated[(kind, Strict(), *constraints)]


TopK = strict(int, Field(default=10, ge=1, le=100, description="answers per ranking"))
EvidenceCount = strict(int, Field(default=3, ge=0, le=20, description="evidence sentences per kNN answer"))


LIMITS = {"n_docs": MAX_N_DOCS, "k": MAX_K, "lm_words": MAX_K}  # the service's caps beyond what Settings allows


def _option(field, spec) -> tuple:
    """A request option made from a `Settings` field's declaration (query/settings.py): its type, help, and bounds or
    choices. The schema states them; Settings checks them (`_checked`), so that the message is the library's. The
    service's own caps (LIMITS) are checked here, first, and its JSON type (`strict`)."""
    schema = {"type": {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}[field.type]}
    schema |= {"enum": list(spec.choices)} if spec.choices else {}
    bounds = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
    schema |= {key: getattr(spec, name) for name, key in bounds.items() if getattr(spec, name) is not None}
    cap = [Field(le=LIMITS[field.name])] if field.name in LIMITS else []
    schema |= {"maximum": LIMITS[field.name]} if cap else {}
    finite = {"allow_inf_nan": False} if field.type == "float" else {}
    description = f"{spec.help}; {spec.note}" if spec.note else spec.help
    option = Field(default=None, description=description, **finite)
    return Annotated[strict(TYPES[field.type], *cap), WithJsonSchema(schema)] | None, option


Options = create_model(
    "Options",
    __config__=ConfigDict(extra="forbid"),
    __doc__="Per-request settings; unset ones keep the server's (the datastore's tuned values or bertknn's defaults).",
    **{field.name: _option(field, spec) for field, spec in SPECS},
)


FillMask = strict(
    bool, Field(default=False, description="also give each ranking as transformers' fill-mask pipeline does")
)


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
    date: Annotated[str | None, Field(max_length=40)] = Field(
        None,
        description="the document's date, ISO 8601 (2024-05-01 or 2024-05-01T09:30:00Z): of the documents about one "
        "subject the newest wins where they disagree; without it, a document is as new as the documents added before "
        "it, and newer than them",
    )
    aliases: Annotated[list[Annotated[str, Field(max_length=300), UTF8]] | None, Field(max_length=100)] = Field(
        None, description="other names of the document's subject, by which a question may name it"
    )

    @model_validator(mode="after")
    def _readable(self) -> DocumentIn:
        self.document()
        return self

    def document(self) -> Document:
        """The document as `bertknn add` reads it from a corpus file (`text.parse_document`; CorpusError)."""
        return parse_document(self.model_dump(exclude_none=True), "the document")


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
    count: int = Field(1, description="the contexts this entry stands for (more than 1 in a pruned datastore)")
    date: str | None = Field(None, description="its document's date (ISO 8601), where it was given one")


class FillMaskOut(BaseModel):
    """An answer in the format of transformers' fill-mask pipeline."""

    score: float
    token: int | list[int] = Field(description="the token's id; for a word of several tokens, the list of their ids")
    token_str: str
    sequence: str = Field(description="the question with its mask filled")


class LinkOut(BaseModel):
    """The subject found in a question asked without one: its title, the question's text that names it and where."""

    subject: str
    text: str
    span: list[int] = Field(description="the text's start and end in the question (characters)")
    by: str = Field(description="how the text names it: title, alias or part of the title")


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
    superseded: list[NeighbourOut] = Field(
        default_factory=list,
        description="where newer documents about the subject outvoted older ones: each older one's nearest statement",
    )
    linked: LinkOut | None = Field(
        default=None, description="asked without a subject: the subject found in the question (subject is it)"
    )
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


def document_chars(doc: DocumentIn) -> int:
    """A document's size as `max_document_chars` counts it: title and text together."""
    passages = [doc.text] if isinstance(doc.text, str) else doc.text
    return len(doc.title) + sum(len(p) for p in passages)
