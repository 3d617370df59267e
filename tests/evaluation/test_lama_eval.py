"""LAMA evaluation end to end on the tiny BERT: ranks, resumption, summary, report; the tuning grid's exact ranks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertknn.evaluation.facts import Fact, fact_key, ir_subject, load_lama, uhn_string_match
from bertknn.evaluation.metrics import UNRANKED, rank_of, summarize
from bertknn.evaluation.report import write_report
from bertknn.evaluation.results import results_name, results_run
from bertknn.evaluation.run import evaluate_facts, lama_reader
from bertknn.evaluation.tune import FactCache, cache_facts, grid_search
from bertknn.query.pipeline import BertKNN
from bertknn.query.settings import PAPER
from bertknn.store.manifest import Manifest


@pytest.fixture()
def facts(lama_dir, tokenizer):
    return load_lama(lama_dir, tokenizer)


def test_ranks_equal_a_direct_computation(built, facts, tmp_path):
    rows = evaluate_facts(built, facts, tmp_path / "results.jsonl")
    assert [r["key"] for r in rows] == [fact_key(f) for f in facts]
    for fact, row in zip(facts, rows):
        pred = built.predict(fact.question, subject=ir_subject(fact))
        assert row["ranks"]["bert"] == rank_of(pred.p_bert, fact.answer_id)
        assert row["ranks"]["bert_knn"] == rank_of(pred.p, fact.answer_id, None, built.encoder.vocab_size)
        assert row["ranks"]["knn"] == rank_of(pred.p_knn, fact.answer_id)
    lisbon = rows[1]  # Ilsa Varnhold: the titled document says "born in Lisbon"
    assert lisbon["documents"] == ["Ilsa Varnhold"] and lisbon["ceiling"] is True
    squad = rows[3]  # retrieval by the question's words finds nothing in the small corpus: BERT alone answers
    assert squad["documents"] == [] and squad["ranks"]["knn"] == UNRANKED
    assert squad["ranks"]["bert_knn"] == squad["ranks"]["bert"] and squad["ceiling"] is False


def test_without_subjects_every_question_is_asked_as_a_user_asks_it(built, facts, tmp_path):
    name = results_name(built, "full", with_subject=False)
    assert name.endswith("-full-nosubject.jsonl") and name != results_name(built, "full")
    rows = evaluate_facts(built, facts, tmp_path / name, with_subject=False)
    for fact, row in zip(facts, rows):
        pred = built.predict(fact.question)  # no subject: the one its text names (linking), else TF-IDF
        assert row["documents"] == pred.documents and row["ranks"]["bert_knn"] == rank_of(
            pred.p, fact.answer_id, None, built.encoder.vocab_size
        )
    with_subject = evaluate_facts(built, facts, tmp_path / "with.jsonl")
    assert rows[1]["documents"] == with_subject[1]["documents"] == ["Ilsa Varnhold"]  # the subject, linked
    unlinked = BertKNN(built.encoder, built.store, link=False)  # TF-IDF on the question's words, no title shortcut
    plain = evaluate_facts(unlinked, facts, tmp_path / "plain.jsonl", with_subject=False)
    assert plain[1]["documents"] != with_subject[1]["documents"]


def test_a_lazy_datastore_embeds_each_batchs_documents_in_view(facts, small_corpus, encoder, tmp_path):
    reader = lama_reader(small_corpus, encoder, directory=tmp_path / "lazy")  # lazy: nothing embedded yet
    assert len(reader.store.documents.pending()) == reader.store.n_documents
    reports = []
    rows = evaluate_facts(reader, facts, tmp_path / "r.jsonl", batch_size=1, progress=lambda *r: reports.append(r))
    embedding = [(done, total) for phase, done, total in reports if phase == "embedding"]
    embedded = reader.store.n_documents - len(reader.store.documents.pending())
    assert len(rows) == len(facts) and embedded > 0
    assert embedding[-1] == (embedded, embedded)  # one running count over the batches
    assert [d for d, _ in embedding] == sorted(d for d, _ in embedding)


def test_interrupted_evaluation_resumes_without_recomputing(built, facts, tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"
    first = evaluate_facts(built, facts[:2], path)
    with path.open("a") as handle:
        handle.write('{"key": "cut by a ki')  # a line cut mid-write by a kill
    asked = []
    real = type(built).predict_batch

    def counting(self, queries, *args, **kwargs):
        asked.extend(q.text for q in queries)  # the questions come checked and encoded (`BertKNN.preprocess`)
        return real(self, queries, *args, **kwargs)

    monkeypatch.setattr(type(built), "predict_batch", counting)
    rows = evaluate_facts(built, facts, path)
    assert sorted(asked) == sorted(f.question for f in facts[2:])
    assert rows[:2] == first and len(rows) == len(facts)


def test_a_time_limit_gives_a_random_subset_that_a_rerun_completes(built, facts, tmp_path):
    path = tmp_path / "results.jsonl"
    assert evaluate_facts(built, facts, path, max_seconds=1e-9, batch_size=1) == []  # the deadline has passed
    assert len(evaluate_facts(built, facts, path, batch_size=1)) == len(facts)


def test_summary_and_report(built, facts, tmp_path):
    rows = evaluate_facts(built, facts, tmp_path / "results.jsonl")
    summary = summarize(rows)
    assert set(summary["sets"]) == {"T-REx", "Google-RE", "SQuAD", "LAMA", "LAMA-UHN"}
    assert summary["sets"]["LAMA"]["facts"] == 3 and summary["sets"]["LAMA"]["relations"] == 2
    expected = np.mean(
        [np.mean([r["ranks"]["bert"] == 1 for r in rows if r["relation"] == rel]) for rel in ("P19", "place_of_birth")]
    )
    assert summary["sets"]["LAMA"]["metrics"]["bert"]["P@1"] == pytest.approx(expected)
    md = write_report(tmp_path / "report", summary, rows, {"model": "tiny"})
    text = md.read_text()
    for heading in ("## LAMA and LAMA-UHN", "## Per group", "| T-REx/P19 |", "## Examples", "- model: tiny"):
        assert heading in text
    assert (tmp_path / "report" / "p_at_k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "report" / "report.json").read_text())["setting"] == {"model": "tiny"}


def test_results_names_read_back_as_what_the_run_did():
    from bertknn.query.settings import Settings

    class Run:  # what results_name reads of a BertKNN
        def __init__(self, settings):
            self.settings, self.store = settings, type("Store", (), {"manifest": Manifest(layer=11)})()

    paper = results_name(Run(PAPER), "full")
    assert results_run(paper) == {
        "block": "11",
        "hyperparameters": "n3-k128-T6.0-l0.3",
        "vote": "the paper's",
        "mixture": "linear",
        "lambda": "constant",
        "options": "none",
        "vocabulary": "full",
        "questions": "with the subject",
    }
    tuned = Settings(n_docs=1, k=64, temperature=34.51, lam=0.25, doc_temperature=0.2, lam_by="entropy", lm_words=0)
    tuned = tuned.replace(sentence_temperature=0.1)
    assert results_name(Run(tuned), "full").endswith(
        "-dt0.2-entropy-loglin-w0-st0.1-ct1.25-f0.4-named-linked-full.jsonl"
    )
    assert results_run(results_name(Run(tuned), "common", with_subject=False)) == {
        "block": "11",
        "hyperparameters": "n1-k64-T34.51-l0.25",
        "vote": "retrieval-aware (doc_temperature 0.2)",
        "mixture": "log-linear",
        "lambda": "adaptive (entropy)",
        "options": "lm_words 0, sentence_temperature 0.1, confidence_temperature 1.25, lm_floor 0.4, entity filter, "
        "subject linking",
        "vocabulary": "common",
        "questions": "without the subject",
    }
    assert results_run("results.jsonl") is None and results_run("notes-L5-full.jsonl") is None


def test_a_report_sets_the_runs_of_its_directory_side_by_side(built, facts, tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    with_subject = evaluate_facts(built, facts, out / results_name(built, "full"))
    without = evaluate_facts(built, facts, out / results_name(built, "full", False), with_subject=False)
    (out / "results-unknown.jsonl").write_text(json.dumps(with_subject[0]) + "\n")  # not a run's name: left out
    text = write_report(out, summarize(with_subject), with_subject, {"model": "tiny"}).read_text()
    section = text.split("## Runs side by side")[1].split("## Examples")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    runs = {results_name(built, "full", False): without, results_name(built, "full"): with_subject}
    names = sorted(runs)  # by file name: "-full-nosubject.jsonl" comes first
    assert list(runs) == names and [r.split(" | ")[0] for r in rows[:3]] == ["| run", "| A", "| B"]
    assert names[0] in rows[1] and "| without the subject |" in rows[1]
    assert names[1] in rows[2] and "| with the subject |" in rows[2]

    def p1(selected, method):
        return f"{100 * summarize(selected)['sets']['LAMA']['metrics'][method]['P@1']:.1f}"

    lama = [r for r in rows if r.split(" | ")[0] in ("| A", "| B")][2:]
    for line, name in zip(lama, names):
        assert line.split(" | ")[1] == f"{p1(runs[name], 'knn')} / {p1(runs[name], 'bert_knn')}"
    relation = next(r for r in rows if r.startswith("| T-REx/P19 |")).strip("| ").split(" | ")
    expected = [
        " / ".join(
            f"{100 * np.mean([x['ranks'][m] == 1 for x in runs[name] if x['relation'] == 'P19']):.1f}"
            for m in ("knn", "bert_knn")
        )
        for name in names
    ]
    assert relation[1:] == expected


def test_uhn_string_match_drops_rome_in_romeo():
    fact = Fact("T-REx", "P19", "Romeo Ferraris", "Rome", "romeo ferraris was born in [MASK] .", 0)
    assert uhn_string_match(fact)
    assert not uhn_string_match(Fact("T-REx", "P19", "Dante", "Florence", "q", 0))


def dense_rank(c: FactCache, n_docs: int, k: int, temperature: float, lam: float, mixture: str = "linear") -> range:
    """The BERT-kNN rank computed the slow way, on the full vocabulary: the ranks it may take where other tokens'
    scores tie gold's within float64 rounding (1e-12 relative: the grid reaches the same scores by another formula,
    and the LM gives many tokens the very same float32 probability)."""
    values, dist = c.neighbours[n_docs][0][:k], c.neighbours[n_docs][1][:k]
    p = c.p_bert.copy()
    if len(values):
        w = np.exp(-(dist - dist.min()) / temperature)
        q = np.bincount(values, weights=w / w.sum(), minlength=len(p))[: len(p)]  # words of several pieces: votes
        p = lam * q + (1 - lam) * c.p_bert if mixture == "linear" else q**lam * c.p_bert ** (1 - lam)
    if p[c.gold] == 0:
        return range(UNRANKED, UNRANKED + 1)
    tie = 1e-12 * p[c.gold]
    sure, maybe = np.count_nonzero(p > p[c.gold] + tie), np.count_nonzero(p > p[c.gold] - tie)  # maybe: gold too
    return range(1 + int(sure), 1 + int(maybe))


def test_grid_ranks_equal_the_dense_computation(built, facts):
    cache = cache_facts(built, facts)
    lambdas = np.array([0.2, 0.5, 0.8])
    crafted = FactCache(  # gold (2) is no neighbour's word: the log-linear mixture never ranks it
        np.array([0.1, 0.2, 0.6, 0.1]), 2, {n: (np.array([0, 3, 3]), np.array([1.0, 2.0, 3.0])) for n in range(1, 6)}
    )
    for c in [*cache, crafted]:
        for n_docs, k, temperature in ((1, 64, 6.0), (3, 4, 0.5), (5, 512, 30.0)):
            for mixture in ("linear", "log-linear"):
                got = c.ranks(n_docs, k, temperature, lambdas, mixture)
                want = [dense_rank(c, n_docs, k, temperature, lam, mixture) for lam in lambdas]
                assert all(g in w for g, w in zip(got.tolist(), want, strict=True)), (got, want)
    assert crafted.ranks(1, 64, 6.0, lambdas, "log-linear").tolist() == [UNRANKED] * 3
    assert crafted.ranks(1, 64, 6.0, lambdas, "linear").tolist() == [1, 2, 3]  # the LM still ranks it


def test_grid_search_orders_settings_and_includes_the_paper(built, facts):
    grid = grid_search(facts, cache_facts(built, facts))
    assert [r["P@1"] for _, r in grid] == sorted((r["P@1"] for _, r in grid), reverse=True)
    assert any(settings == PAPER for settings, _ in grid)
    temperatures = len({s.temperature for s, _ in grid})
    assert len(grid) == len({settings for settings, _ in grid}) == 5 * 3 * 7 * temperatures * 2  # both mixtures
    assert {s.mixture for s, _ in grid} == {"linear", "log-linear"} and {s.doc_temperature for s, _ in grid} == {0}
