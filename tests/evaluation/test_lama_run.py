"""`eval lama`'s parts: the facts it selects, its run over layers, and its report's setting."""

from __future__ import annotations

import time

import pytest

from bertknn.evaluation.facts import held_out, load_lama, sample_per_relation, select_facts
from bertknn.evaluation.metrics import summarize
from bertknn.evaluation.report import lama_setting
from bertknn.evaluation.run import evaluate_layers
from bertknn.model.train_head import is_heldout


def test_select_facts_parses_groups_and_filters_held_out_subjects(lama_dir, tokenizer):
    facts = select_facts(lama_dir, tokenizer, "T-REx, SQuAD")
    assert [f.subject for f in facts] == ["Dante Alighieri", "Ilsa Varnhold", "Squad"]
    held = select_facts(lama_dir, tokenizer, "T-REx,SQuAD", heldout_only=True)
    assert held == [f for f in facts if f.group == "SQuAD" or is_heldout(f.subject)]
    assert held == held_out(facts)


def test_select_facts_samples_per_relation_and_refuses_an_empty_selection(lama_dir, tokenizer):
    one = select_facts(lama_dir, tokenizer, "T-REx,Google-RE", per_relation=1, seed=3)
    assert one == sample_per_relation(load_lama(lama_dir, tokenizer, ["T-REx", "Google-RE"]), 1, 3)
    assert sorted(f.relation for f in one) == ["P19", "place_of_birth"]
    warned = []
    with pytest.raises(ValueError, match=f"no LAMA facts to evaluate in {lama_dir} for groups ConceptNet"):
        select_facts(lama_dir, tokenizer, "ConceptNet", warn=warned.append)
    assert len(warned) == 1 and warned[0].endswith("not found; ConceptNet skipped")


def test_evaluate_layers_reports_the_encoders_layer_and_compares_the_others(
    lama_dir, tokenizer, small_corpus, encoder, tmp_path
):
    facts = load_lama(lama_dir, tokenizer)
    summary, rows, reader = evaluate_layers(small_corpus, encoder, facts, tmp_path / "rep", layers=[2, 3])
    assert reader.store.manifest.layer == encoder.layer == 3 and len(rows) == len(facts)
    assert summary["layers"].keys() == {"2", "3"}
    assert summary["layers"]["3"] == summary["sets"]["LAMA"]["metrics"]
    assert sorted(p.name.split("-")[1] for p in (tmp_path / "rep").glob("results-*-full.jsonl")) == ["L2", "L3"]
    alone, alone_rows, alone_reader = evaluate_layers(small_corpus, encoder, facts, tmp_path / "rep", layers=[2])
    assert (
        alone_reader.store.manifest.layer == 2 and "layers" not in alone
    )  # the first layer when the encoder's is not run
    assert alone == summarize(alone_rows)
    assert alone["sets"]["LAMA"]["metrics"] == summary["layers"]["2"]  # the same results, resumed from their file


def test_lama_setting_says_what_was_evaluated(built, encoder, small_corpus):
    setting = lama_setting(encoder, built, 4, 3, small_corpus, 2, 5, True, "common", {"n_docs": 2}, time.time() - 10)
    assert setting == {
        "model": f"{encoder.name} (as given)",
        "layer": "3 of 4",
        "corpus": f"{small_corpus} (5 documents; {built.store.size:,} contexts embedded so far). "
        "Results depend on the corpus: the paper used full English Wikipedia",
        "datastore": str(built.store.path),
        "keys": "exact (one masked target per pass)",
        "facts": "3 evaluated of 4 (sample of 2 per relation, seed 5, subjects held out from head training only); "
        "PARTIAL: a random subset, rerun the same command to complete it",
        "ranking vocabulary": "LAMA common vocabulary",
        "hyperparameters": "n_docs=3, k=128, temperature=6.0, lam=0.5 (as given on the command line where set)",
        "vote, sentences, mixture, lambda, probabilities": "vote retrieval-aware (doc_temperature=0.2); sentences each "
        "neighbour weighted by exp(score / 0.015), score how well its sentence and clause say what the question asks, "
        "at least 0.7, for the words the LM finds possible answers (sentence_temperature); mixture log-linear, "
        "p_kNN^lam p_LM^(1-lam) renormalised (mixture=log-linear); lambda constant (the paper's); probabilities "
        "calibrated (confidence_temperature=1.25, lm_floor=0.4)",
        "questions": "with the subject: its document by title, else TF-IDF on the subject (the paper)",
        "LAMA-UHN": "string-match filter applied; person-name filter not applied (it needs a cased BERT)",
        "wall time": "10 s (this run; cached embeddings and results are reused)",
    }
    plain = lama_setting(encoder, built, 4, 4, small_corpus, None, 0, False, "full", {}, time.time())
    assert plain["facts"] == "4 evaluated of 4 (all)"
    paper = " (bertknn's defaults; the paper's: n_docs=3, k=128, temperature=6.0, lam=0.3)"
    assert plain["hyperparameters"].endswith(paper)
    built.settings = built.settings.replace(
        doc_temperature=0,
        lam_by="entropy",
        mixture="linear",
        lam=0.3,
        confidence_temperature=1,
        lm_floor=0,
        sentence_temperature=0,
    )
    assert lama_setting(encoder, built, 4, 4, small_corpus, None, 0, False, "full", {"mixture": "linear"}, 0)[
        "hyperparameters"
    ].endswith(" (the paper's)")  # a setting beyond the numbers given: the numbers are still the paper's
    asked = lama_setting(encoder, built, 4, 4, small_corpus, None, 0, False, "full", {}, time.time(), False)
    assert asked["vote, sentences, mixture, lambda, probabilities"] == (
        "vote the paper's (all neighbours vote together); sentences all alike (the paper's); mixture linear (the "
        "paper's); lambda adaptive by the kNN's entropy (lam_by=entropy); probabilities as combined (the paper's)"
    )
    assert asked["questions"].startswith("WITHOUT the subject (--no-subject)")
    assert plain["ranking vocabulary"] == f"full model vocabulary ({encoder.vocab_size:,})"
