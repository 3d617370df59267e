"""Calibration: the expected calibration error against values computed by hand, and the settings of the shown
probabilities' temperature and LM floor (`combine.calibrate` itself: test_combine.py)."""

import pytest

from bertknn.evaluation.metrics import calibration, top_answer_calibration
from bertknn.query.settings import PAPER, Settings


def test_the_expected_calibration_error_of_crafted_answers():
    got = calibration([0.95, 0.95, 0.55, 0.15, 1.0], [True, False, True, False, True])
    # bins: 0.9-1.0 holds 0.95, 0.95, 1.0 (accuracy 2/3), 0.5-0.6 holds 0.55 (1), 0.1-0.2 holds 0.15 (0)
    expected = 3 / 5 * abs(2 / 3 - 2.9 / 3) + 1 / 5 * 0.45 + 1 / 5 * 0.15
    assert got["ece"] == pytest.approx(expected)
    assert got["answers"] == 5
    assert [(b["low"], b["answers"]) for b in got["bins"]] == [(0.1, 1), (0.5, 1), (0.9, 3)]
    assert got["bins"][2]["accuracy"] == pytest.approx(2 / 3)
    assert calibration([0.5, 0.5], [True, False])["ece"] == 0.0


def test_top_answer_calibration_reads_the_shown_top_answer():
    rows = [
        {"answer": "Paris", "top3": {"bert_knn": [["paris", 0.9], ["rome", 0.1]]}},
        {"answer": "oslo", "top3": {"bert_knn": [["bergen", 0.7]]}},
        {"answer": "oslo", "top3": {"bert_knn": []}},
    ]
    got = top_answer_calibration(rows, "bert_knn")
    assert got == calibration([0.9, 0.7, 0.0], [True, False, False])


def test_the_paper_is_uncalibrated_and_bad_values_are_named():
    assert (PAPER.confidence_temperature, PAPER.lm_floor) == (1.0, 0.0)
    with pytest.raises(ValueError, match="confidence_temperature must be a number > 0") as err:
        Settings(confidence_temperature=0, lm_floor=1.0)
    assert "lm_floor must be a number in [0, 1)" in str(err.value)
    tag = Settings(confidence_temperature=2.0, lm_floor=0.1).file_tag()
    assert tag.endswith("-ct2.0-f0.1-named-linked")
