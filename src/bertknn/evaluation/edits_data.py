"""Knowledge edits in CounterFact's layouts (Meng et al. 2022, ROME; EasyEdit's counterfact-*.json): reading them into
`EditRecord`s, the dev/test halves, and what an edit becomes in BERT-kNN (a document) and what is asked about it
(three cloze questions), for `edits.evaluate_edits` and `edits.Editor`.

Two layouts, a JSON list or JSON Lines of either, told apart per record:
- flat (EasyEdit): case_id, prompt, subject, target_new, ground_truth, rephrase_prompt, locality_prompt,
  locality_ground_truth, all strings but case_id;
- nested (ROME): case_id, requested_rewrite {prompt with "{}" for the subject, subject, target_new {str},
  target_true {str}, relation_id}, paraphrase_prompts, neighborhood_prompts. The first paraphrase and the first
  neighbourhood prompt are used (one question of each kind per edit, as in the flat layout); the neighbourhood's
  answer is target_true, whose fact the edit must leave alone.

An edit is the document {"id": "edit-<case_id>", "title": subject, "text": prompt + " " + target_new + "."}; its
questions are the prompt, the paraphrase and the locality prompt, each + " [MASK] .". The halves are fixed by
case_id alone, before anything is tuned: dev = even case_ids, test = odd ones.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bertknn.text import MASK, question_error, unicode_error

SPLITS = ("dev", "test", "all")
KINDS = ("rewrite", "rephrase", "locality")  # an edit's three questions: efficacy, generalisation, locality
FLAT_FIELDS = "prompt subject target_new ground_truth rephrase_prompt locality_prompt locality_ground_truth"
FLAT = tuple(FLAT_FIELDS.split())  # the fields of the flat layout besides case_id


class EditsError(ValueError):
    """An edits file that cannot be used as it is; the message names the file, the record and the field."""


@dataclass(frozen=True)
class EditRecord:
    """One counterfactual edit: `prompt` (its subject filled in) should be completed by `target_new` after the edit,
    as the paraphrase `rephrase_prompt` should; `locality_prompt`, about another subject, should keep its answer
    (`locality_ground_truth`). `ground_truth` is the prompt's true answer before the edit; `relation` is ROME's
    relation_id (None in the flat layout, which has none)."""

    case_id: int
    prompt: str
    subject: str
    target_new: str
    ground_truth: str
    rephrase_prompt: str
    locality_prompt: str
    locality_ground_truth: str
    relation: str | None = None


@dataclass(frozen=True)
class LongNumber:
    """A JSON integer of more digits than Python converts to an int (`sys.get_int_max_str_digits`), kept as its
    length, so that the record and the field holding it can be named."""

    digits: int

    def __repr__(self) -> str:
        return f"a number of {self.digits:,} digits"


@dataclass(frozen=True)
class Question:
    """A cloze question about an edit: its text, the subject IR retrieves by (None: from the text), and the two
    answers it is scored against: the edit's new target and the true one (the locality prompt's own answer for a
    locality question; "" when unknown)."""

    text: str
    subject: str | None
    new: str
    true: str


def cloze(prompt: str) -> str:
    """A prompt as a cloze question: the prompt + " [MASK] ."."""
    return f"{prompt.strip()} {MASK} ."


def fill(prompt: str, subject: str) -> str:
    """A ROME prompt with its "{}" replaced by the subject (a prompt without one as it is)."""
    return prompt.replace("{}", subject)


def edit_document(record: EditRecord) -> dict:
    """The document that makes an edit: id "edit-<case_id>", the subject as title, the prompt completed by the new
    target as text."""
    return {"id": f"edit-{record.case_id}", "title": record.subject, "text": f"{record.prompt} {record.target_new}."}


def questions_of(record: EditRecord, with_subject: bool) -> tuple[Question, Question, Question]:
    """An edit's questions (KINDS order): the prompt and the paraphrase (with the subject when `with_subject`), and
    the locality prompt, always without one (neither layout names its subject)."""
    subject = record.subject if with_subject else None
    new, true = record.target_new, record.ground_truth
    return (
        Question(cloze(record.prompt), subject, new, true),
        Question(cloze(record.rephrase_prompt), subject, new, true),
        Question(cloze(record.locality_prompt), None, new, record.locality_ground_truth),
    )


def _text(value: object, where: str, field: str, question: bool = False) -> str:
    """A non-empty string field (a prompt: usable as a cloze question once " [MASK] ." is added)."""
    if not isinstance(value, str) or not value.strip():
        got = "missing" if value is None else f"not a non-empty string ({value!r})"
        raise EditsError(f"{where}: field {field!r} is {got}")
    if MASK in value:
        raise EditsError(f"{where}: field {field!r} holds {MASK}: a prompt is completed by the answer, not masked")
    error = question_error(cloze(value)) if question else unicode_error(value)  # a lone surrogate: tokenizers fail
    if error:
        raise EditsError(f"{where}: field {field!r}: {error}")
    return value.strip()


def _integer(digits: str) -> int | LongNumber:
    """An integer's digits (JSON's, or a string case_id's) as an int, or a LongNumber when Python converts no
    integer that long."""
    try:
        return int(digits)
    except ValueError:  # over sys.get_int_max_str_digits() digits
        return LongNumber(len(digits.strip().lstrip("+-")))


def _case_id(value: object, where: str) -> int:
    """A whole number >= 0, or its digits as a string."""
    if isinstance(value, str) and value.strip().isdecimal():  # the digits int() reads (isdigit() also takes "²")
        value = _integer(value)
    if isinstance(value, LongNumber):
        limit = sys.get_int_max_str_digits()
        raise EditsError(f"{where}: field 'case_id' has {value.digits:,} digits, over Python's limit of {limit:,}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        got = "missing" if value is None else f"not a whole number >= 0 ({value!r})"
        raise EditsError(f"{where}: field 'case_id' is {got}")
    return value


def _first(value: object, where: str, field: str) -> object:
    """The first item of a non-empty list field (ROME's prompts)."""
    if not isinstance(value, list) or not value:
        raise EditsError(f"{where}: field {field!r} is {'missing' if value is None else 'not a non-empty list'}")
    return value[0]


def _target(rewrite: dict, where: str, field: str) -> str:
    target = rewrite.get(field)
    if not isinstance(target, dict):
        raise EditsError(f"{where}: field 'requested_rewrite.{field}' is missing or not an object with 'str'")
    return _text(target.get("str"), where, f"requested_rewrite.{field}.str")


def _nested(raw: dict, where: str) -> EditRecord:
    """A record in ROME's layout."""
    rewrite = raw["requested_rewrite"]
    if not isinstance(rewrite, dict):
        raise EditsError(f"{where}: field 'requested_rewrite' is not an object")
    subject = _text(rewrite.get("subject"), where, "requested_rewrite.subject")
    prompt = fill(_text(rewrite.get("prompt"), where, "requested_rewrite.prompt"), subject)
    _text(prompt, where, "requested_rewrite.prompt", question=True)
    true = _target(rewrite, where, "target_true")
    neighbour = _first(raw.get("neighborhood_prompts"), where, "neighborhood_prompts")
    if isinstance(neighbour, dict):  # {"prompt": ...}, as some conversions write them
        neighbour = neighbour.get("prompt")
    relation = rewrite.get("relation_id")
    paraphrase = _first(raw.get("paraphrase_prompts"), where, "paraphrase_prompts")
    return EditRecord(
        case_id=_case_id(raw.get("case_id"), where),
        prompt=prompt,
        subject=subject,
        target_new=_target(rewrite, where, "target_new"),
        ground_truth=true,
        rephrase_prompt=_text(paraphrase, where, "paraphrase_prompts[0]", question=True),
        locality_prompt=_text(neighbour, where, "neighborhood_prompts[0]", question=True),
        locality_ground_truth=true,
        relation=str(relation) if relation is not None else None,
    )


def _flat(raw: dict, where: str) -> EditRecord:
    """A record in EasyEdit's flat layout."""
    values = {field: _text(raw.get(field), where, field, question=field.endswith("prompt")) for field in FLAT}
    values["prompt"] = fill(values["prompt"], values["subject"])
    return EditRecord(case_id=_case_id(raw.get("case_id"), where), **values)


def parse_edit(raw: object, where: str) -> EditRecord:
    """One record of either layout; EditsError naming `where` and the field when it is not usable."""
    if not isinstance(raw, dict):
        raise EditsError(f"{where}: expected a JSON object (an edit), not {type(raw).__name__}")
    return _nested(raw, where) if "requested_rewrite" in raw else _flat(raw, where)


def _loads(text: str, where: str) -> object:
    """JSON text, its integers too long for an int as LongNumbers (named with their record later); EditsError naming
    `where` when it nests deeper than Python's parser recurses."""
    try:
        return json.loads(text, parse_int=_integer)
    except RecursionError:
        raise EditsError(f"{where}: JSON nested too deeply to read (arrays or objects within each other)") from None


def _raw_records(path: Path) -> list[tuple[str, object]]:
    """(where, record) of a JSON list or a JSON Lines file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise EditsError(f"{path}: not UTF-8 text ({err})") from None
    if text.lstrip().startswith("["):
        try:
            records = _loads(text, str(path))
        except json.JSONDecodeError as err:
            raise EditsError(f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
        return [(f"{path}, record {i + 1}", raw) for i, raw in enumerate(records)]
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                where = f"{path}, record {len(out) + 1} (line {number})"
                out.append((where, _loads(line, where)))
            except json.JSONDecodeError as err:
                raise EditsError(f"{path}, line {number}: not valid JSON ({err.msg})") from None
    return out


def load_edits(path: str | Path) -> list[EditRecord]:
    """The edits of a CounterFact file (a JSON list or JSON Lines, flat or ROME's layout, in file order). EditsError
    naming the file, the record and the field for a record that cannot be used, or a case_id given twice."""
    path = Path(path)
    records, seen = [], {}
    for where, raw in _raw_records(path):
        record = parse_edit(raw, where)
        if record.case_id in seen:
            raise EditsError(f"{where}: case_id {record.case_id} is given twice (first in {seen[record.case_id]})")
        seen[record.case_id] = where
        records.append(record)
    if not records:
        raise EditsError(f"{path}: holds no edits")
    return records


def split_edits(records: Sequence[EditRecord], split: str = "all", n: int | None = None) -> list[EditRecord]:
    """The records of a half: "dev" (even case_ids), "test" (odd ones) or "all", then the first `n` of them in file
    order (None: all). Fixed by case_id alone, so no tuning can choose it."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    if n is not None and n < 1:
        raise ValueError(f"the number of edits must be >= 1 (got {n})")
    kept = [r for r in records if split == "all" or r.case_id % 2 == (split == "test")]
    return kept[:n] if n is not None else kept
