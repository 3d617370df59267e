"""Evaluation: LAMA reading and filters on crafted files, ranks and macro metrics against hand computation."""

from __future__ import annotations

import numpy as np
import pytest

from bertknn.evaluation.facts import load_lama, sample_per_relation
from bertknn.evaluation.metrics import fact_metrics, macro_metrics, rank_of


def test_filters_templates_and_lowercasing(lama_dir, tokenizer):
    facts = load_lama(lama_dir, tokenizer)
    assert [(f.group, f.subject, f.answer) for f in facts] == [
        ("T-REx", "Dante Alighieri", "Florence"),
        ("T-REx", "Ilsa Varnhold", "Lisbon"),
        ("Google-RE", "Khatchig Mouradian", "Lebanon"),
        ("SQuAD", "Squad", "gold"),
    ]
    assert facts[0].question == "dante alighieri was born in [MASK] ."
    assert facts[0].answer_id == tokenizer.convert_tokens_to_ids("florence")
    assert facts[3].question == "The [MASK] color was used."


def test_common_vocabulary_filter(lama_dir, tokenizer):
    facts = load_lama(lama_dir, tokenizer, groups=("T-REx",), common_vocab={"florence"})
    assert [f.answer for f in facts] == ["Florence"]


def test_rank_counts_strictly_better_tokens():
    p = np.array([0.1, 0.4, 0.2, 0.2, 0.1])
    assert [rank_of(p, i) for i in range(5)] == [4, 1, 2, 2, 4]


def test_macro_differs_from_micro(lama_dir, tokenizer):
    facts = load_lama(lama_dir, tokenizer, groups=("T-REx", "Google-RE"))
    result = macro_metrics(facts, [1, 7, 20])  # P19: ranks 1 and 7; place_of_birth: rank 20
    assert result["relations"]["T-REx/P19"] == {"P@1": 0.5, "P@5": 0.5, "P@10": 1.0, "MRR": (1 + 1 / 7) / 2, "facts": 2}
    assert result["groups"]["Google-RE"]["MRR"] == pytest.approx(1 / 20)
    assert result["macro"]["P@1"] == pytest.approx(0.25)  # micro would be 1/3
    assert fact_metrics(3) == {"P@1": 0.0, "P@5": 1.0, "P@10": 1.0, "MRR": 1 / 3}


def test_sampling_is_deterministic_per_seed(lama_dir, tokenizer):
    facts = load_lama(lama_dir, tokenizer) * 5
    assert sample_per_relation(facts, 2, seed=1) == sample_per_relation(facts, 2, seed=1)
    assert len(sample_per_relation(facts, 2, seed=1)) == 6  # 2 per relation, 3 relations
