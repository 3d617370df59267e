"""BERT-kNN's query settings, in one record: the paper's values are written here and nowhere else.

`Settings` is frozen and checked when made, so a `Settings` in hand is always valid: the library (`BertKNN`), the
service (per-request options), `bertknn tune` (its grid) and the evaluation (result file names) all pass one along
instead of re-checking dicts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

RETRIEVALS = ("ir", "faiss", "ir+faiss")  # where the neighbours come from (BertKNN.predict)
LAM_RULES = ("constant", "entropy")  # how lambda is set per question (`combine.confident_lam` for "entropy")
MIXTURES = ("linear", "log-linear")  # how p_kNN and p_LM are combined (`combine.interpolate`); linear: the paper
CONFLICTS = ("newest", "vote")  # how the documents of one subject weigh (`knn.version_weights`)
# bertknn's defaults beyond the paper, each kept on the LAMA dev split (bench/README.md, `bench/accuracy.py`):
MIXTURE = "log-linear"  # p_kNN^lam p_LM^(1-lam), renormalised
LAM = 0.5  # lambda of that mixture (the paper's 0.3 is for the linear one)
DOC_TEMPERATURE = 0.2  # the retrieval-aware vote's temperature; 0: the paper's vote
LM_WORDS = 5  # the LM scores the words of several tokens among the kNN's this many most probable words; 0: all
WORD_BONUS = 15.0  # the log-linear mixture's factor for a word of several tokens (bench/words.py and LAMA dev fit it)
SENTENCE_TEMPERATURE = 0.015  # T_s of the sentence weight exp(score / T_s); 0: none
NEWER = 20.0  # conflicts "newest": a newer document that speaks to the question as nearly outvotes an older by e^NEWER
CONFIDENCE_TEMPERATURE = 1.25  # the probabilities' temperature, fitted by bench/calibration.py; 1: none
LM_FLOOR = 0.4  # the share of the LM's distribution mixed into them, fitted with it; 0: none
HPARAMS = ("n_docs", "k", "temperature", "lam")  # the numeric ones
TUNED = (*HPARAMS, "mixture")  # what `bertknn tune` searches and stores


@dataclass(frozen=True)
class Spec:
    """A setting declared once: what it does, its bounds or choices, and its command-line flag. `Settings` checks
    values by it; the CLI's options (cli/options.py) and the service's request schema (serving/schemas.py) are made
    from it, so a setting appears everywhere or nowhere."""

    help: str
    ge: float | None = None  # bounds of a number: >= ge, > gt, <= le, < lt
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] = ()  # the values a text setting takes
    note: str = ""  # what an edge value means ("0: the paper's vote")
    flag: str = ""  # the command line's name, where it is not --the-name

    def range(self) -> str:
        """The bounds as the CLI's help shows them: "x>=0", "0<=x<1"; "" for none."""
        low = f"{self.ge}<=" if self.ge is not None else f"{self.gt}<" if self.gt is not None else ""
        high = f"<={self.le}" if self.le is not None else f"<{self.lt}" if self.lt is not None else ""
        if low and not high:
            return f"x>={self.ge}" if self.ge is not None else f"x>{self.gt}"
        return f"{low}x{high}" if low or high else ""

    def problem(self, name: str, kind: str, value: object) -> str | None:
        """What is wrong with `value` for the setting `name` of type `kind` ("int", "float", "str", "bool"), None if
        nothing."""
        if kind == "bool":
            return None if isinstance(value, bool) else f"{name} must be true or false, not {value!r}"
        if kind == "str":
            ok = isinstance(value, str) and value in self.choices
            return None if ok else f"{name} must be one of {', '.join(self.choices)}, not {value!r}"
        number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        if (
            number
            and (kind != "int" or value == int(value))
            and (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        ):
            return None
        note = f" ({self.note})" if self.note else ""
        return (
            f"{name} must be {'a whole number' if kind == 'int' else 'a number'} {self._bounds()}{note}, not {value!r}"
        )

    def _bounds(self) -> str:
        """The bounds in an error message: ">= 1", "in [0, 1)"."""
        low, high = (self.ge, self.gt), (self.le, self.lt)
        if any(b is not None for b in low) and any(b is not None for b in high):
            left = f"[{self.ge}" if self.ge is not None else f"({self.gt}"
            return f"in {left}, {self.le}]" if self.le is not None else f"in {left}, {self.lt})"
        if self.ge is not None:
            return f">= {self.ge}"
        return f"> {self.gt}" if self.gt is not None else f"<= {self.le}" if self.le is not None else f"< {self.lt}"


def setting(default: object, help: str, **spec: object) -> object:
    """A field of `Settings` with its `Spec`."""
    return dataclasses.field(default=default, metadata={"spec": Spec(help, **spec)})


def _check_names(names, known: tuple[str, ...]) -> None:
    unknown = set(names) - set(known)
    if unknown:
        raise TypeError(f"unknown hyperparameter(s) {sorted(unknown)}; known: {sorted(known)}")


@dataclass(frozen=True)
class Settings:
    """How a question is answered: the paper's values (`PAPER`), except the kNN vote (retrieval-aware), the mixture
    (log-linear, with its own lambda) and the probabilities (calibrated) by default.

    n_docs: documents retrieved by IR; k: nearest neighbours; temperature: the l of exp(-d/l), d the squared
    distance; lam: weight of p_kNN against the LM's distribution; retrieval: where the neighbours come from, one of
    RETRIEVALS ("ir", the paper: the documents IR selects; "faiss": the whole datastore's FAISS index; "ir+faiss":
    both). Beyond the paper: doc_temperature > 0 makes the kNN vote retrieval-aware (each retrieved document's
    neighbours vote within it, weighted by p(d|q), a softmax of its retrieval score over doc_temperature:
    `knn.document_vote`), on by default since it helped on the dev split (0: the paper's vote); mixture: "linear"
    (the paper: lam p_kNN + (1 - lam) p_LM) or "log-linear" (p_kNN^lam p_LM^(1-lam), renormalised: an answer needs
    both the neighbours' and the LM's support), log-linear by default since it helped on the dev split; lam_by
    "entropy" scales lam per question by the kNN's confidence (`combine.confident_lam`), off since it did not help;
    lm_words: the LM scores the words of several tokens among the kNN's lm_words most probable words (the probability
    of the word's first token at the question's mask: `words.scored`), 0 all of them; the others get an LM score of 0
    (bench/words.py measures the choice);
    word_bonus: the log-linear mixture multiplies a word of several tokens by this (1: none), a prior for such words
    like a speech recogniser's word insertion bonus: the LM is a weak judge of words it cannot spell in one token
    (it gives invented words that fit and that do not fit alike low scores) and would otherwise veto the neighbours'
    evidence for them; sentence_temperature > 0 weighs each neighbour within its document by exp(score / T_s), the
    score how well its sentence and clause say what the question asks (`model.sentences`, whose fixed parts say
    which neighbours are scored and how a score moves the vote), so that of one document's places the one said in
    a sentence like the question wins, of the words the LM finds possible answers (a year does not answer "born
    in"); on by default, read from the datastore's evidence vectors (a store made before them answers without until
    `bertknn sentences` stores them); 0: every sentence alike, as in the paper; confidence_temperature
    and lm_floor make the probabilities shown honest (`combine.calibrate`: temperature scaling, then a share of the LM's
    distribution mixed in), both fitted on a dev split (1 and 0: as combined). conflicts: where several documents
    carry the subject's title (an article and its updates), their neighbours vote together as one document's, and
    with "newest" each newer document's count e^NEWER times the next older one's, so that a fact stated anew wins
    where its evidence is about as near as the old one's (`knn.version_weights`); "vote": all alike. entity_filter:
    TF-IDF's documents are searched only where they name the question's entity, holding all its names
    (`retrieval.TfidfIndex.about`), so that evidence about another entity never answers, and the subject's own
    name in its article does not vote (`search.in_mentions`); off in the paper, whose retrieval keeps both. link:
    a question asked without a subject is given the one its text names (`linking.link`), so that it searches as if
    the subject had been given; off in the paper, whose questions without one search by TF-IDF.
    Made with bad values, it raises ValueError naming every problem.
    """

    n_docs: int = setting(3, "documents retrieved", ge=1)
    k: int = setting(128, "nearest neighbours", ge=1)
    temperature: float = setting(6.0, "kNN temperature l in exp(-d/l), d the squared distance", gt=0)
    lam: float = setting(LAM, "weight of p_kNN against the LM's p", ge=0, le=1, flag="--lambda")
    retrieval: str = setting(
        "ir",
        "neighbours from: ir (the documents IR picks: the paper), faiss (the whole datastore's FAISS index: "
        "`bertknn index`), ir+faiss",
        choices=RETRIEVALS,
    )
    doc_temperature: float = setting(
        DOC_TEMPERATURE,
        "retrieval-aware kNN: each retrieved document's neighbours vote within it, weighted by a softmax of its "
        "retrieval score over this temperature",
        ge=0,
        note="0: the paper's vote",
    )
    lam_by: str = setting(
        "constant",
        "lambda per question: constant (the paper) or entropy (scaled by the kNN's confidence)",
        choices=LAM_RULES,
    )
    mixture: str = setting(
        MIXTURE, "how p_kNN and the LM's p combine: linear (the paper) or log-linear", choices=MIXTURES
    )
    lm_words: int = setting(
        LM_WORDS,
        "the LM scores the answers of several tokens among the kNN's this many best words (by their first token); "
        "the log-linear mixture leaves the others out",
        ge=0,
        note="0: every word of several tokens",
    )
    word_bonus: float = setting(
        WORD_BONUS,
        "the log-linear mixture's factor for answers of several tokens, whose LM scores are weak evidence",
        gt=0,
        note="1: none",
    )
    sentence_temperature: float = setting(
        SENTENCE_TEMPERATURE,
        "weigh each neighbour within its document by exp(score / this), the score how well its sentence says what "
        "the question asks (read from the datastore's evidence vectors)",
        ge=0,
        note="0: no sentence weights",
    )
    confidence_temperature: float = setting(
        CONFIDENCE_TEMPERATURE, "the probabilities' temperature (calibration)", gt=0, note="1: none"
    )
    lm_floor: float = setting(
        LM_FLOOR, "the share of the LM's distribution mixed into the probabilities shown", ge=0, lt=1, note="0: none"
    )
    conflicts: str = setting(
        "newest",
        "where documents about the subject disagree: newest (a newer document whose evidence speaks to the question "
        "about as nearly outvotes the older ones) or vote (all alike)",
        choices=CONFLICTS,
    )
    link: bool = setting(
        True,
        "where no subject is given, find it in the question among the datastore's titles, aliases and the parts of "
        "titles that name one article alone, and search as with that subject",
    )
    entity_filter: bool = setting(
        True,
        "keep only retrieved documents that name the question's subject (or, without one, its capitalised names), "
        "and leave the subject's own name in its article out of the vote",
    )

    def __post_init__(self) -> None:
        problems = [spec.problem(field.name, field.type, getattr(self, field.name)) for field, spec in SPECS]
        if any(problems):
            raise ValueError("; ".join(p for p in problems if p))

    def replace(self, **overrides) -> Settings:
        """These settings with the non-None `overrides`, checked: unknown names raise TypeError, bad values
        ValueError. With nothing to change it returns `self` (nothing is checked twice)."""
        _check_names(overrides, FIELDS)
        changes = {name: value for name, value in overrides.items() if value is not None}
        return dataclasses.replace(self, **changes) if changes else self

    @classmethod
    def from_tuned(cls, values: object) -> Settings:
        """The default settings with what `bertknn tune` stored in a datastore's manifest (a dict of TUNED names);
        raises as `replace` does. A record without a mixture predates it: its numbers were tuned for the linear one."""
        values = values if isinstance(values, dict) else {"hparams": values}
        _check_names(values, TUNED)
        if values and "mixture" not in values:
            values = {**values, "mixture": "linear"}
        return cls().replace(**values)

    @property
    def hparams(self) -> dict:
        """The numeric settings (HPARAMS) as a dict: what /health shows."""
        return {name: getattr(self, name) for name in HPARAMS}

    @property
    def tuned(self) -> dict:
        """What `bertknn tune` searches and stores (TUNED) as a dict."""
        return {name: getattr(self, name) for name in TUNED}

    def as_dict(self) -> dict:
        """Every setting as a dict (keyword arguments of `BertKNN` and `replace`)."""
        return dataclasses.asdict(self)

    def file_tag(self) -> str:
        """The numeric settings in a file name, e.g. "n3-k128-T6.0-l0.3" (evaluation's result files), and the
        options beyond the paper that are on (`lm_words` and `word_bonus` where not bertknn's defaults)."""
        extra = (
            (f"-dt{self.doc_temperature}" if self.doc_temperature else "")
            + (f"-{self.lam_by}" if self.lam_by != "constant" else "")
            + ("-loglin" if self.mixture == "log-linear" else "")
            + (f"-w{self.lm_words}" if self.lm_words != LM_WORDS else "")
            + (f"-b{self.word_bonus}" if self.word_bonus != WORD_BONUS else "")
            + (f"-st{self.sentence_temperature}" if self.sentence_temperature else "")
            + (f"-ct{self.confidence_temperature}" if self.confidence_temperature != 1 else "")
            + (f"-f{self.lm_floor}" if self.lm_floor else "")
            + (f"-c{self.conflicts}" if self.conflicts != "newest" else "")
            + ("-named" if self.entity_filter else "")
            + ("-linked" if self.link else "")
        )
        return f"n{self.n_docs}-k{self.k}-T{self.temperature}-l{self.lam}{extra}"


SPECS = tuple((field, field.metadata["spec"]) for field in dataclasses.fields(Settings))  # each field and its Spec
TYPES = {"int": int, "float": float, "str": str, "bool": bool}  # a field's type, declared as a string, as a type
FIELDS = tuple(field.name for field, _ in SPECS)
PAPER = Settings(  # the paper's method exactly (Kassner and Schütze)
    lam=0.3,
    doc_temperature=0.0,
    mixture="linear",
    sentence_temperature=0.0,
    confidence_temperature=1.0,
    lm_floor=0.0,
    entity_filter=False,
    link=False,
)
DEFAULT = Settings()  # bertknn's: the paper's with the retrieval-aware vote, the log-linear mixture, calibrated
