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
WORD_BONUS = 10.0  # the log-linear mixture's factor for a word of several tokens (bench/words.py fits it)
SENTENCE_TEMPERATURE = 0.015  # T_s of the sentence weight exp(score / T_s); 0: none
NEWER = 20.0  # conflicts "newest": a newer document that speaks to the question as nearly outvotes an older by e^NEWER
CONFIDENCE_TEMPERATURE = 1.25  # the probabilities' temperature, fitted by bench/calibration.py; 1: none
LM_FLOOR = 0.4  # the share of the LM's distribution mixed into them, fitted with it; 0: none
HPARAMS = ("n_docs", "k", "temperature", "lam")  # the numeric ones
TUNED = (*HPARAMS, "mixture")  # what `bertknn tune` searches and stores


BOUNDS = (  # the other numeric settings: (lowest, lowest excluded, above the highest) and what the error says
    ("doc_temperature", (0, False, math.inf), ">= 0 (0: the paper's vote)"),
    ("word_bonus", (0, True, math.inf), "> 0 (1: none)"),
    ("sentence_temperature", (0, False, math.inf), ">= 0 (0: no sentence weights)"),
    ("confidence_temperature", (0, True, math.inf), "> 0 (1: none)"),
    ("lm_floor", (0, False, 1), "in [0, 1) (0: none)"),
)


def _in_bounds(value: object, low: float, strict: bool, high: float) -> bool:
    """Whether `value` is a finite number (not a bool) from `low` (excluded when `strict`) to below `high`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return (value > low if strict else value >= low) and value < high


def _out_of_bounds(settings: Settings, bounds: tuple) -> list[str]:
    """What is wrong with `settings`' values of `bounds` (BOUNDS rows), in their order."""
    return [
        f"{name} must be a number {what}, not {getattr(settings, name)!r}"
        for name, (low, strict, high), what in bounds
        if not _in_bounds(getattr(settings, name), low, strict, high)
    ]


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
    lm_words: the LM scores (one more model pass per word length) the words of several tokens among the kNN's
    lm_words most probable words, 0 all of them; the others get an LM score of 0 (bench/words.py measures the choice);
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
    name in its article does not vote (`search.in_mentions`); off in the paper, whose retrieval keeps both.
    Made with bad values, it raises ValueError naming every problem.
    """

    n_docs: int = 3
    k: int = 128
    temperature: float = 6.0
    lam: float = LAM
    retrieval: str = "ir"
    doc_temperature: float = DOC_TEMPERATURE
    lam_by: str = "constant"
    mixture: str = MIXTURE
    lm_words: int = LM_WORDS
    word_bonus: float = WORD_BONUS
    sentence_temperature: float = SENTENCE_TEMPERATURE
    confidence_temperature: float = CONFIDENCE_TEMPERATURE
    lm_floor: float = LM_FLOOR
    conflicts: str = "newest"
    entity_filter: bool = True

    def __post_init__(self) -> None:
        wrong_retrieval = (
            []
            if isinstance(self.retrieval, str) and self.retrieval in RETRIEVALS
            else [f"retrieval must be one of {', '.join(RETRIEVALS)}, not {self.retrieval!r}"]
        )
        odd = [
            f"{name} must be a finite number (got {value!r})"
            for name, value in self.hparams.items()
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
        ]
        if odd:
            raise ValueError("; ".join(odd + wrong_retrieval))
        n_docs, k, temperature, lam = self.n_docs, self.k, self.temperature, self.lam
        problems = [
            msg
            for bad, msg in (
                (n_docs < 1 or n_docs != int(n_docs), f"n_docs must be a whole number >= 1 (got {n_docs})"),
                (k < 1 or k != int(k), f"k must be a whole number >= 1 (got {k})"),
                (not temperature > 0, f"temperature must be > 0 (got {temperature})"),
                (not 0 <= lam <= 1, f"lam must be in [0, 1] (got {lam})"),
            )
            if bad
        ] + wrong_retrieval
        problems += _out_of_bounds(self, BOUNDS[:1])
        if self.lam_by not in LAM_RULES:
            problems.append(f"lam_by must be one of {', '.join(LAM_RULES)}, not {self.lam_by!r}")
        lm_words = self.lm_words
        if isinstance(lm_words, bool) or not isinstance(lm_words, int) or lm_words < 0:
            problems.append(f"lm_words must be a whole number >= 0 (0: every word of several tokens), not {lm_words!r}")
        problems += _out_of_bounds(self, BOUNDS[1:])
        if self.mixture not in MIXTURES:
            problems.append(f"mixture must be one of {', '.join(MIXTURES)}, not {self.mixture!r}")
        if not isinstance(self.entity_filter, bool):
            problems.append(f"entity_filter must be true or false, not {self.entity_filter!r}")
        if self.conflicts not in CONFLICTS:
            problems.append(f"conflicts must be one of {', '.join(CONFLICTS)}, not {self.conflicts!r}")
        if problems:
            raise ValueError("; ".join(problems))

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
        )
        return f"n{self.n_docs}-k{self.k}-T{self.temperature}-l{self.lam}{extra}"


FIELDS = tuple(field.name for field in dataclasses.fields(Settings))
PAPER = Settings(  # the paper's method exactly (Kassner and Schütze)
    lam=0.3,
    doc_temperature=0.0,
    mixture="linear",
    sentence_temperature=0.0,
    confidence_temperature=1.0,
    lm_floor=0.0,
    entity_filter=False,
)
DEFAULT = Settings()  # bertknn's: the paper's with the retrieval-aware vote, the log-linear mixture, calibrated
