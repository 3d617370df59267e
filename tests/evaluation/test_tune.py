"""`bertknn tune`'s parts: the dev split (kept out of the eval sample), the dev facts' cache, the grid files."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from bertknn.evaluation.facts import Fact, fact_key, load_lama, sample_per_relation
from bertknn.evaluation.report import write_grid
from bertknn.evaluation.run import lama_reader
from bertknn.evaluation.tune import DevSplit, cache_facts
from bertknn.model.train_head import is_heldout
from bertknn.query.settings import PAPER, Settings


def _facts(n: int = 10) -> list[Fact]:
    """Two T-REx relations of n facts, one Google-RE relation of n - 4, 8 SQuAD questions."""
    kb = [("T-REx", "P19", n), ("T-REx", "P20", n), ("Google-RE", "place_of_birth", n - 4)]
    facts = [
        Fact(g, rel, f"{rel} subject {i}", "paris", f"{rel} subject {i} [MASK] .", 0)
        for g, rel, m in kb
        for i in range(m)
    ]
    return facts + [Fact("SQuAD", "squad", "Squad", "gold", f"question {i} is [MASK] .", 0) for i in range(8)]


def test_dev_split_is_disjoint_from_the_eval_sample_and_takes_n_per_relation():
    facts = _facts()
    split = DevSplit(per_relation=3, squad=2, exclude_per_relation=4, seed=0)
    dev = split.choose(facts)
    evaluated = {fact_key(f) for f in sample_per_relation(facts, 4, 0)}  # `eval lama --sample-per-relation 4`
    assert not evaluated & {fact_key(f) for f in dev}
    assert Counter(f.relation for f in dev) == {"P19": 3, "P20": 3, "place_of_birth": 2, "squad": 2}  # 6 - 4 left: 2
    squad_left = [f for f in facts if f.group == "SQuAD" and fact_key(f) not in evaluated]
    assert [f for f in dev if f.group == "SQuAD"] == squad_left[:2]  # the first ones, in file order
    assert split.choose(facts) == dev and DevSplit(3, 2, 4, seed=1).choose(facts) != dev
    assert split.describe(dev) == (
        "10 dev facts: 2 SQuAD + 3 per T-REx/Google-RE relation (seed 1), "
        "disjoint from the eval sample of 4 per relation (seed 0)"
    )


def test_dev_split_of_held_out_subjects_only():
    facts = _facts(30)  # held out: 4 subjects of P19, 6 of P20, 3 of place_of_birth
    split = DevSplit(per_relation=3, squad=None, exclude_per_relation=2, heldout_only=True)
    dev = split.choose(facts)
    kept = [f for f in facts if f.group == "SQuAD" or is_heldout(f.subject)]
    evaluated = {fact_key(f) for f in sample_per_relation(kept, 2, 0)}  # `eval lama --heldout-only` sample
    assert all(is_heldout(f.subject) for f in dev if f.group != "SQuAD")
    assert not evaluated & {fact_key(f) for f in dev}
    assert Counter(f.relation for f in dev) == {"P19": 2, "P20": 3, "place_of_birth": 1, "squad": 6}
    assert split.describe(dev) == (
        "12 dev facts: 6 SQuAD + 3 per T-REx/Google-RE relation (seed 1), held-out subjects, "
        "disjoint from the eval sample of 2 per relation (seed 0)"
    )


def test_no_dev_fact_left_is_an_error():
    with pytest.raises(ValueError, match="no dev facts left to tune on"):
        DevSplit(exclude_per_relation=10).choose(_facts())


def test_embedded_only_keeps_the_facts_whose_documents_are_embedded(
    lama_dir, tokenizer, small_corpus, encoder, tmp_path
):
    facts = load_lama(lama_dir, tokenizer)  # Dante, Ilsa, Khatchig Mouradian, one SQuAD question
    reader = lama_reader(small_corpus, encoder, directory=tmp_path / "lazy")  # lazy: nothing embedded yet
    split = DevSplit(per_relation=10, exclude_per_relation=0, embedded_only=True)
    assert [f.subject for f in split.choose(facts, reader)] == ["Khatchig Mouradian", "Squad"]  # no document found
    reports = []
    cache = cache_facts(reader, facts, lambda phase, done, total: reports.append((phase, done, total)))
    assert len(cache) == len(facts) and reports[0] == ("embedding", 0, 2) and reports[-1] == ("caching", 4, 4)
    assert ("embedding", 2, 2) in reports  # the documents of Dante and Ilsa Varnhold, embedded
    assert split.choose(facts, reader) == facts
    assert split.describe(facts).startswith(
        "4 dev facts: 1 SQuAD + 10 per T-REx/Google-RE relation (seed 1), documents"
    )


def test_write_grid_writes_the_table_and_the_json(tmp_path):
    grid = [
        (Settings(1, 64, 5.0, 0.5, mixture="log-linear"), {"P@1": 0.5, "P@10": 0.75, "MRR": 0.6}),
        (PAPER, {"P@1": 0.25, "P@10": 1.0, "MRR": 1 / 3}),
    ]
    md = write_grid(tmp_path / "tune", "4 dev facts", grid)
    assert md == tmp_path / "tune" / "grid.md"
    assert md.read_text(encoding="utf-8") == (
        "# Grid search (4 dev facts)\n\n"
        "| n_docs | k | temperature | lambda | mixture | P@1 | P@10 | MRR |\n"
        "|---|---|---|---|---|---|---|---|\n"
        "| 1 | 64 | 5.0 | 0.5 | log-linear | 50.0 | 75.0 | 60.0 |\n"
        f"| {PAPER.n_docs} | {PAPER.k} | {PAPER.temperature} | {PAPER.lam} | linear | 25.0 | 100.0 | 33.3 |\n"
    )
    saved = json.loads((tmp_path / "tune" / "grid.json").read_text(encoding="utf-8"))
    assert saved == {
        "dev": "4 dev facts",
        "grid": [
            {"n_docs": 1, "k": 64, "temperature": 5.0, "lam": 0.5, "mixture": "log-linear"}
            | {"P@1": 0.5, "P@10": 0.75, "MRR": 0.6},
            PAPER.tuned | {"P@1": 0.25, "P@10": 1.0, "MRR": 1 / 3},
        ],
    }


def test_dev_split_keeps_out_the_sample_eval_lama_draws_from_all_groups():
    """ConceptNet's relations sort before T-REx's: the eval sample of T-REx depends on them, so the split must draw
    its exclusion from the same groups `eval lama` loads by default; ConceptNet itself is never tuned on."""
    concept = [Fact("ConceptNet", "AtLocation", "x", "paris", f"thing {i} is at [MASK] .", 0) for i in range(7)]
    facts = concept + _facts()
    dev = DevSplit(per_relation=3, squad=2, exclude_per_relation=4, seed=0).choose(facts)
    evaluated = {fact_key(f) for f in sample_per_relation(facts, 4, 0)}  # `eval lama` with its default groups
    assert not evaluated & {fact_key(f) for f in dev}
    assert Counter(f.relation for f in dev) == {"P19": 3, "P20": 3, "place_of_birth": 2, "squad": 2}
    without = {fact_key(f) for f in sample_per_relation(_facts(), 4, 0)}
    assert without != evaluated - {fact_key(f) for f in concept}  # the draw really depends on ConceptNet
