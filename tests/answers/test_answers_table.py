"""answers() on a table: keys, modes, checker rewards, both layouts, stratified selection on
answer modes without embeddings, the zero-signal report and drop, and bad input in one line."""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mrt_fast
from mrt_fast import MrtInputError
from mrt_fast.answers.table import mode_code

FORMS = {  # equivalent ways to write each answer, and prose around it
    "408": ["The product is 408.", "so 408", "408", "= 408.0"],
    "480": ["it is 480", "480.00 in total"],
    "1/2": ["half: \\frac{1}{2}", "x = 0.5", "answer .50"],
}


def math_pools(seed: int, n_pools: int = 6) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_pools):
        keys = list(FORMS)[: 1 + p % 3]
        for j in range(int(rng.integers(2, 7))):
            if rng.random() < 0.15:
                rows.append((p, f"I cannot tell ({p}, {j})", "408"))
                continue
            k = keys[int(rng.integers(len(keys)))]
            rows.append((p, FORMS[k][int(rng.integers(len(FORMS[k])))], "408"))
    return pl.DataFrame(rows, schema=["prompt_id", "response", "ref"], orient="row")


def test_keys_modes_and_rewards():
    df = pl.DataFrame({"prompt_id": [1, 1, 1, 1], "response": ["so 408", "The product is 408.", "480", "hmm"],
                       "ref": ["408"] * 4})
    out, rep = mrt_fast.answers(df, reference="ref", return_report=True)
    assert out["answer"].to_list() == ["408", "408", "480", None]
    m = out["mode"].to_list()
    assert m[0] == m[1] != m[2] and m[3] not in (m[0], m[2])
    assert out["reward"].to_list() == [1.0, 1.0, 0.0, 0.0] and out["correct"].to_list() == [True, True, False, False]
    assert (rep.responses, rep.pools, rep.answered, rep.unanswered) == (4, 1, 3, 1)
    assert (rep.rows, rep.rows_out, rep.parts, rep.layout) == (4, 4, 1, "flat")
    assert out.columns == ["prompt_id", "response", "ref", "answer", "mode", "reward", "correct"]


def test_modes_are_the_same_code_in_every_pool_and_unanswered_rows_stay_apart():
    df = pl.DataFrame({"prompt_id": [1, 1, 2, 2], "response": ["408", "no", "408.0", "nope"]})
    out = mrt_fast.answers(df)
    assert out["mode"][0] == out["mode"][2] == mode_code("408", None)
    assert len({out["mode"][1], out["mode"][3], out["mode"][0]}) == 3
    assert "reward" not in out.columns  # no reference, no reward


def test_the_package_is_callable_and_is_the_area():
    import importlib

    assert mrt_fast.answers is importlib.import_module("mrt_fast.answers")
    df = pl.DataFrame({"prompt_id": [1], "response": ["\\boxed{3}"]})
    assert mrt_fast.answers(df, extract="boxed")["answer"].to_list() == ["3"]


@pytest.mark.parametrize("check, kw, ref, want", [
    ("numeric", dict(abs_tol=0.01), "408.001", [1.0, 0.0]),
    ("exact", {}, "408.001", [0.0, 0.0]),
    ("set", {}, ["408", "480"], [1.0, 1.0]),
    ("set", {}, '["480"]', [0.0, 1.0]),
])
def test_checkers(check, kw, ref, want):
    df = pl.DataFrame({"prompt_id": [1, 1], "response": ["408", "480"], "ref": [ref, ref]})
    assert mrt_fast.answers(df, reference="ref", check=check, **kw)["reward"].to_list() == want


def test_callable_checker_partial_credit_and_reward_levels():
    df = pl.DataFrame({"prompt_id": [1, 1, 1], "response": ["10", "5", "none"], "ref": ["10"] * 3})

    def closeness(key, ref):
        return min(1.0, float(key) / float(ref))

    out = mrt_fast.answers(df, reference="ref", check=closeness, reward_wrong=-1.0, reward_missing=-2.0)
    assert out["reward"].to_list() == [1.0, 0.0, -2.0]  # half credit: halfway from -1 to 1
    assert out["correct"].to_list() == [True, False, False]
    out = mrt_fast.answers(df, reference="ref", check=closeness, partial=False)
    assert out["reward"].to_list() == [1.0, 0.0, 0.0]


def test_reference_forms_are_read_as_answers():
    df = pl.DataFrame({"prompt_id": [1, 1, 1], "response": ["so 72", "\\boxed{B}", "x"],
                       "ref": ["Natalia sold 48/2 = 24 clips\n#### 72", "\\boxed{72}", None]})
    out, rep = mrt_fast.answers(df, reference="ref", return_report=True)
    assert out["reward"].to_list() == [1.0, 0.0, 0.0] and rep.null_references == 1
    mc = pl.DataFrame({"prompt_id": [1, 1], "response": ["The answer is (B).", "Answer: C"], "ref": ["(B)", "B"]})
    assert mrt_fast.answers(mc, extract="choice", reference="ref")["correct"].to_list() == [True, False]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000))
def test_grouped_layout_equals_flat(seed):
    df = math_pools(seed)
    flat = mrt_fast.answers(df, reference="ref")
    g = df.group_by("prompt_id", maintain_order=True).agg("response", pl.col("ref").first())
    grouped = mrt_fast.answers(g, reference="ref")
    back = grouped.explode(["response", "answer", "mode", "reward", "correct"]).select(flat.columns)
    assert back.equals(flat)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000))
def test_keys_do_not_depend_on_row_order_or_the_rest_of_the_table(seed):
    df = math_pools(seed)
    out = mrt_fast.answers(df, reference="ref")
    shuffled = df.with_row_index("i").sample(fraction=1.0, shuffle=True, seed=seed)
    out2 = mrt_fast.answers(shuffled.drop("i"), reference="ref").with_columns(shuffled["i"]).sort("i").drop("i")
    assert out2.equals(out)
    half = mrt_fast.answers(df.head(df.height // 2), reference="ref")
    assert half.equals(out.head(df.height // 2))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.integers(1, 3), st.integers(1, 3))
def test_stratified_on_answer_modes_needs_no_embeddings_and_keeps_one_per_answer(seed, m, copies):
    rng = np.random.default_rng(seed)
    keys = list(FORMS)[:m]
    rows = [(p, FORMS[k][int(rng.integers(len(FORMS[k])))] + " " * int(rng.integers(0, 3)))
            for p in range(4) for k in keys for _ in range(copies)]
    out = mrt_fast.answers(pl.DataFrame(rows, schema=["prompt_id", "response"], orient="row"))
    assert "embedding" not in out.columns
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mrt_fast.SmallPoolWarning)
        kept, rep = mrt_fast.select(out, m, method="stratified", return_report=True)
    # modes of equal size and K = the number of answers: each answer kept once
    per = kept.group_by("prompt_id").agg(pl.col("answer").sort())
    assert all(sorted(a) == sorted(keys) for a in per["answer"].to_list())
    assert rep.n_one_mode_pools == (4 if m == 1 else 0)


def test_zero_signal_report_drop_and_cap():
    df = pl.DataFrame({"prompt_id": [1, 1, 2, 2, 3, 3, 4, 4],
                       "response": ["408", "408", "1", "2", "408", "480", "7", "7"],
                       "ref": ["408"] * 8})
    out, rep = mrt_fast.answers(df, reference="ref", return_report=True)
    assert (rep.zero_signal_pools, rep.all_correct_pools, rep.all_wrong_pools, rep.one_answer_pools) == (3, 1, 2, 2)
    line = next(x for x in str(rep).splitlines() if "no learning signal" in x)
    assert line.endswith(" 3 of 4 prompts (all rewards equal: 1 all correct, 2 all wrong)")
    kept, rep = mrt_fast.answers(df, reference="ref", drop_zero_signal=True, return_report=True)
    assert kept["prompt_id"].unique().to_list() == [3] and (rep.dropped_pools, rep.dropped_rows) == (3, 6)
    # without a reference: one answer is no signal
    _, rep = mrt_fast.answers(df, return_report=True)
    assert rep.zero_signal_pools == 2 and not rep.rewarded


@settings(max_examples=20, deadline=None)
@given(st.floats(0.0, 1.0), st.integers(0, 1000))
def test_a_capped_share_is_chosen_by_prompt_id_alone(share, seed):
    rng = np.random.default_rng(seed)
    n = 60
    df = pl.DataFrame({"prompt_id": np.repeat(np.arange(n), 2),
                       "response": [str(v) for v in rng.integers(0, 2, size=2 * n)], "ref": ["1"] * (2 * n)})
    kept = mrt_fast.answers(df, reference="ref", drop_zero_signal=share)
    kept_ids = set(kept["prompt_id"].to_list())
    # the same prompts are kept from any subset of the pools: the choice is by id, not by the table
    sub = df.filter(pl.col("prompt_id") < n // 2)
    assert set(mrt_fast.answers(sub, reference="ref", drop_zero_signal=share)["prompt_id"].to_list()) == \
        {p for p in kept_ids if p < n // 2}
    full = mrt_fast.answers(df, reference="ref")
    signal = full.group_by("prompt_id").agg(pl.col("reward").n_unique() > 1).filter(pl.col("reward"))
    assert set(signal["prompt_id"].to_list()) <= kept_ids  # pools with signal are always kept
    if share == 0.0:
        assert kept_ids == set(signal["prompt_id"].to_list())


def test_pandas_and_arrow_tables():
    df = pl.DataFrame({"prompt_id": [1, 1], "response": ["1", "2"]})
    want = mrt_fast.answers(df)
    assert mrt_fast.answers(df.to_arrow()).equals(want)
    assert mrt_fast.answers(df.to_pandas()).equals(want)


# ------------------------------------------------------------------ bad input


def test_a_raising_extract_function_names_its_row_and_value():
    df = pl.DataFrame({"prompt_id": [1, 1, 1], "response": ["1", "2", "boom"]})

    def fn(text):
        if text == "boom":
            raise ValueError("cannot read")
        return text

    with pytest.raises(MrtInputError, match=r"extract function raised ValueError: cannot read at row 2 "
                                            r"\(response 'boom'\)") as e:
        mrt_fast.answers(df, extract=fn)
    assert e.value.row == 2 and "\n" not in str(e.value)
    g = df.group_by("prompt_id").agg("response")
    with pytest.raises(MrtInputError, match="at row 0") as e:  # the grouped table's row
        mrt_fast.answers(g, extract=fn)


def test_a_raising_check_function_names_its_row():
    df = pl.DataFrame({"prompt_id": [1, 1], "response": ["1", "2"], "ref": ["1", "x"]})
    with pytest.raises(MrtInputError, match=r"check function raised ValueError.* at row 1 \(answer '2', "
                                            r"reference 'x'\)"):
        mrt_fast.answers(df, reference="ref", check=lambda k, r: float(k) / float(r) > 0)
    with pytest.raises(MrtInputError, match=r"returned 2.0, not a bool or a number in \[0, 1\]"):
        mrt_fast.answers(df.head(1), reference="ref", check=lambda k, r: 2.0)


@pytest.mark.parametrize("kw, says", [
    (dict(reference="gold"), "column 'gold' \\(reference\\) not found"),
    (dict(response="text"), "column 'text' \\(response\\) not found"),
    (dict(by="pid"), "column 'pid' \\(prompt id\\) not found"),
    (dict(extract="code"), "give tests="),
    (dict(tests="ref"), "needs extract='code'"),
    (dict(check="fuzzy", reference="ref"), "check must be one of"),
    (dict(check="exact", abs_tol=0.1, reference="ref"), "apply to check='numeric' only"),
    (dict(drop_zero_signal=1.5), "drop_zero_signal must be"),
    (dict(answer="ref"), "already has column\\(s\\) \\['ref'\\]"),
    (dict(reference="ref", answer="ref"), "reference column 'ref' is also the answer column .*answer='ref_key'"),
    (dict(reference="ref", correct="ref"), "--correct-column ref_key"),
    (dict(answer="x", mode="x"), "distinct names"),
    (dict(reward_correct=float("nan"), reference="ref"), "finite number"),
    (dict(workers=0), "workers must be"),
])
def test_bad_arguments_are_one_line(kw, says):
    df = pl.DataFrame({"prompt_id": [1], "response": ["1"], "ref": ["1"]})
    with pytest.raises(MrtInputError, match=says) as e:
        mrt_fast.answers(df, **kw)
    assert "\n" not in str(e.value)


def test_non_text_responses_are_refused():
    with pytest.raises(MrtInputError, match="must hold text"):
        mrt_fast.answers(pl.DataFrame({"prompt_id": [1], "response": [3]}))


def test_no_row_is_lost_and_nulls_have_no_answer():
    df = pl.DataFrame({"prompt_id": [1, 1, 2], "response": [None, "3", None]})
    out, rep = mrt_fast.answers(df, return_report=True)
    assert out.height == 3 and out["answer"].to_list() == [None, "3", None] and rep.unanswered == 2
