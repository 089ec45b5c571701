"""`mrt run` with an answers section: the answer is the mode, the checker's verdict the reward."""

from __future__ import annotations

import polars as pl
import pytest

from mrt_fast import MrtInputError
from mrt_fast.answers.run_config import answer_columns, check_answers_config


def test_the_section_is_checked_in_one_line():
    assert check_answers_config(None) is None
    for sec, says in [
        ({"extract": "boxed", "mode": "kmeans", "reference": "a"}, "answers.mode must be one of"),
        ({"extract": "boxed", "reward": "judge", "reference": "a"}, "answers.reward must be one of"),
        ({"extract": "boxed"}, "needs answers.reference"),
        ({"extract": r"regex:\d+", "reference": "a"}, "has no group"),
        ({"extract": "boxed", "reference": "a", "response": "x"}, "set by mrt run"),
        ("boxed", "must be a mapping"),
    ]:
        with pytest.raises(MrtInputError, match=says):
            check_answers_config(sec)
    with pytest.raises(MrtInputError, match="leave out reward_model"):
        check_answers_config({"extract": "boxed", "reference": "a"}, reward_model="rm")
    assert check_answers_config({"extract": "boxed", "reward": "model"}, reward_model="rm")["reward"] == "model"


def test_answer_columns_join_the_reference_of_the_prompts():
    cands = pl.DataFrame({"prompt_id": ["p1", "p1", "p2"], "response": ["so 7", "8", "\\boxed{3}"],
                          "reward": [0.1, 0.2, 0.3]})
    prompts = pl.DataFrame({"prompt_id": ["p1", "p2"], "prompt": ["a", "b"], "gold": ["7", "4"]})
    out = answer_columns(cands, check_answers_config({"extract": "last_number", "reference": "gold"}), prompts)
    assert out.columns == ["prompt_id", "response", "answer", "mode", "reward", "correct"]
    assert out["reward"].to_list() == [1.0, 0.0, 0.0]
    kept = answer_columns(cands, check_answers_config({"reference": "gold", "reward": "model", "mode": "embedding"},
                                                      reward_fn="pkg:fn"), prompts)
    assert kept["reward"].to_list() == [0.1, 0.2, 0.3] and "mode" not in kept.columns
    assert kept["answer_correct"].to_list() == [True, False, False]
    with pytest.raises(MrtInputError, match="column 'nope' not found in the train prompts"):
        answer_columns(cands, {"reference": "nope"}, prompts)


def test_a_reference_column_named_answer_serves():
    """GSM8K's column of reference answers is `answer`, the name of the key column mrt run writes."""
    cands = pl.DataFrame({"prompt_id": ["p1", "p1", "p2"], "response": ["so 7", "8", "\\boxed{3}"]})
    prompts = pl.DataFrame({"prompt_id": ["p1", "p2"], "prompt": ["a", "b"], "answer": ["#### 7", "4"]})
    out = answer_columns(cands, check_answers_config({"extract": "last_number", "reference": "answer"}), prompts)
    assert out.columns == ["prompt_id", "response", "answer", "mode", "reward", "correct"]
    assert out["answer"].to_list() == ["7", "8", "3"] and out["reward"].to_list() == [1.0, 0.0, 0.0]
