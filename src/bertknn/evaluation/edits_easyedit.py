"""EasyEdit's shapes for `edits.Editor`: its requests (`editors/utils.py::_prepare_requests`: prompt, target_new,
ground_truth, portability, locality {key: {prompt, ground_truth}}, subject, rephrase_prompt) and its metrics per edit
(`BaseEditor.edit`: case_id, requested_rewrite, time, pre {rewrite_acc, rephrase_acc, portability}, post
{rewrite_acc, rephrase_acc, locality {<key>_acc}, portability}), each accuracy a list of one number, as EasyEdit's
are. EasyEdit measures token by token under teacher forcing; here an accuracy is 1.0 when the top-1 word is the
target (a locality one: when it is the word it was before the edit), else 0.0.
"""

from __future__ import annotations

from bertknn.evaluation.edits_answers import Answer
from bertknn.evaluation.edits_data import EditsError, Question, cloze
from bertknn.text import unicode_error


def _listed(value: object, n: int, name: str, optional: bool = True) -> list:
    """An EasyEdit argument as a list of `n` strings (a string: one; None, where `optional`: n Nones), each valid
    Unicode (a lone surrogate, from a JSON escape, is refused here rather than by the tokenizer, with a TypeError)."""
    if value is None and optional:
        return [None] * n
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or len(values) != n or not all(isinstance(v, str) and v.strip() for v in values):
        raise EditsError(f"{name} must be {n} non-empty string(s), one per prompt (got {value!r})")
    for i, text in enumerate(values):
        error = unicode_error(text)
        if error:
            raise EditsError(f"{name}{'' if isinstance(value, str) else f'[{i}]'} is {error}")
    return values


def _locality(inputs: dict | None, n: int) -> dict[str, list[tuple[str, str]]]:
    """EasyEdit's locality_inputs ({key: {"prompt": [...], "ground_truth": [...]}}) as (prompt, answer) per edit."""
    out = {}
    for key, value in (inputs or {}).items():
        if not isinstance(value, dict):
            raise EditsError(f"locality_inputs[{key!r}] must be {{'prompt': [...], 'ground_truth': [...]}}")
        prompts = _listed(value.get("prompt"), n, f"locality_inputs[{key!r}]['prompt']", optional=False)
        truths = _listed(value.get("ground_truth"), n, f"locality_inputs[{key!r}]['ground_truth']", optional=False)
        out[str(key)] = list(zip(prompts, truths))
    return out


def easyedit_requests(
    prompts: str | list[str],
    target_new: str | list[str],
    subject: str | list[str] | None = None,
    ground_truth: str | list[str] | None = None,
    rephrase_prompts: str | list[str] | None = None,
    locality_inputs: dict | None = None,
) -> list[dict]:
    """EasyEdit's requests, one per prompt (its "{}" filled with the subject, as ROME's prompts are written)."""
    n = 1 if isinstance(prompts, str) else len(prompts) if isinstance(prompts, list) else 0
    if not n:
        raise EditsError(f"prompts must be a string or a non-empty list of strings (got {prompts!r})")
    prompts = _listed(prompts, n, "prompts", optional=False)
    targets = _listed(target_new, n, "target_new", optional=False)
    subjects, truths = _listed(subject, n, "subject"), _listed(ground_truth, n, "ground_truth")
    rephrases, locality = _listed(rephrase_prompts, n, "rephrase_prompts"), _locality(locality_inputs, n)
    requests = []
    for i, (prompt, target, subj, truth, rephrase) in enumerate(zip(prompts, targets, subjects, truths, rephrases)):
        request = {
            "prompt": prompt.replace("{}", subj) if subj else prompt,
            "target_new": target,
            "ground_truth": truth,
            "portability": {},
            "locality": {key: {"prompt": pairs[i][0], "ground_truth": pairs[i][1]} for key, pairs in locality.items()},
        }
        request |= {"subject": subj} if subj else {}
        request |= {"rephrase_prompt": rephrase} if rephrase else {}
        requests.append(request)
    return requests


def request_questions(request: dict) -> list[tuple[str, Question]]:
    """A request's questions: ("rewrite", ...), ("rephrase", ...) when it has a paraphrase, ("locality:<key>", ...)
    per locality key; the last asked without a subject, the others with the request's (if any)."""
    subject, new, true = request.get("subject"), request["target_new"], request["ground_truth"] or ""
    out = [("rewrite", Question(cloze(request["prompt"]), subject, new, true))]
    if "rephrase_prompt" in request:
        out.append(("rephrase", Question(cloze(request["rephrase_prompt"]), subject, new, true)))
    for key, loc in request["locality"].items():
        out.append((f"locality:{key}", Question(cloze(loc["prompt"]), None, new, loc["ground_truth"])))
    return out


def request_document(request: dict, doc_id: str) -> dict:
    """The document of an edit request: titled by its subject ("" without one), its prompt completed by the target."""
    return {
        "id": doc_id,
        "title": request.get("subject") or "",
        "text": f"{request['prompt']} {request['target_new']}.",
    }


def easyedit_metrics(
    requests: list[dict],
    ids: list[str],
    asked: list[list[tuple[str, Question]]],
    pre: list[Answer],
    post: list[Answer],
    times: list[float],
) -> list[dict]:
    """EasyEdit's metrics per edit from the answers before (`pre`) and after (`post`) the edits (in the order of
    `asked`), with bertknn's "document" (its id) and "answers" (the top-1 words, pre and post) besides."""
    out, at = [], 0
    for i, (request, doc_id, questions, seconds) in enumerate(zip(requests, ids, asked, times)):
        before, after = pre[at : at + len(questions)], post[at : at + len(questions)]
        at += len(questions)
        metric: dict = {"case_id": i, "requested_rewrite": request, "time": seconds}
        metric |= {"pre": {"portability": {}}, "post": {"locality": {}, "portability": {}}}
        for (kind, _), b, a in zip(questions, before, after):
            if kind.startswith("locality:"):
                metric["post"]["locality"][f"{kind.split(':', 1)[1]}_acc"] = [float(a.top[:1] == b.top[:1])]
            else:
                metric["pre"][f"{kind}_acc"], metric["post"][f"{kind}_acc"] = [float(b.new)], [float(a.new)]
        words = {
            stage: {kind: answer.word for (kind, _), answer in zip(questions, got)}
            for stage, got in (("pre", before), ("post", after))
        }
        out.append(metric | {"document": doc_id, "answers": words})
    return out
