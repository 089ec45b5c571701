"""One `variance_budget` for every input, and `VarianceOptions`: its knobs, checked once."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrt_fast import MrtInputError
from mrt_fast.variance import VarianceAccumulator, VarianceOptions, report_from_accumulator, variance_budget


def _pilot(n_prompts=40, k=4, seed=0):
    rng = np.random.default_rng(seed)
    mu = rng.normal(0.0, 1.0, n_prompts)
    return pl.DataFrame({"prompt_id": np.repeat(np.arange(n_prompts), k),
                         "loss": np.repeat(mu, k) + rng.normal(0.0, 2.0, n_prompts * k)})


def _same(a, b):
    da, db = a.to_dict(), b.to_dict()
    da.pop("notes"), db.pop("notes")
    assert da == db


def test_one_variance_budget_everywhere():
    import mrt_fast.datasets
    import mrt_fast.variance.law

    assert mrt_fast.variance_budget is mrt_fast.variance.variance_budget
    assert mrt_fast.datasets.variance_budget is mrt_fast.variance.variance_budget
    # the old module path serves the same objects
    assert mrt_fast.variance.law.variance_budget is mrt_fast.variance.variance_budget
    assert mrt_fast.variance.law.VarianceAccumulator is mrt_fast.VarianceAccumulator
    assert mrt_fast.variance.law.implicit_mrt is mrt_fast.variance.implicit_mrt
    assert mrt_fast.VarianceOptions is VarianceOptions


def test_the_variance_area_reads_a_path_with_the_table_result(tmp_path):
    """`mrt_fast.variance.variance_budget` given a path streams it (the datasets area reads it) and
    gives the report of the table."""
    df = _pilot()
    df.write_parquet(tmp_path / "l.parquet")
    on_table = variance_budget(df, n_boot=50, cost_prompt=3.0)
    on_path = variance_budget(str(tmp_path / "l.parquet"), n_boot=50, cost_prompt=3.0, batch_rows=37)
    _same(on_path, on_table)


def test_what_is_neither_a_table_nor_a_path_is_refused_in_one_line():
    with pytest.raises(MrtInputError, match=r"^data must be a table .*a path or a ray\.data\.Dataset, got list$"):
        variance_budget([1, 2, 3])


def test_the_keywords_are_the_options():
    """`variance_budget` takes each option as a keyword, with the option's default."""
    params = inspect.signature(variance_budget).parameters
    for f in dataclasses.fields(VarianceOptions):
        assert f.name in params, f.name
        assert params[f.name].default == f.default, f.name


@pytest.mark.parametrize("knob, bad", [
    ("cost_prompt", 0), ("cost_response", float("inf")), ("k_grid", "123"), ("k_grid", [0, 2]), ("k_grid", []),
    ("k_max", 0), ("k_max", 2.0), ("budget", -1.0), ("n_prompts", 0), ("n_prompts", 10.5), ("delta", 1.0),
    ("loss_bound", float("nan")), ("n_boot", -1), ("seed", True), ("ci_level", 0), ("bootstrap", "fast"),
    ("interval", "wide"),
])
def test_a_bad_option_is_one_line_naming_it(knob, bad, tmp_path):
    with pytest.raises(MrtInputError, match=knob.replace("k_grid", "k_grid|every k_grid entry")) as e:
        VarianceOptions(**{knob: bad})
    assert "\n" not in str(e.value)
    # checked before any data is read: the file does not exist
    with pytest.raises(MrtInputError, match=knob.replace("k_grid", "k_grid|every k_grid entry")):
        variance_budget(str(tmp_path / "missing.parquet"), **{knob: bad})


def test_options_are_normalised():
    o = VarianceOptions(cost_prompt=2, k_grid=np.array([8, 2, 2, 1]), budget=100, seed=np.int64(3), delta=0.1)
    assert o.k_grid == (1, 2, 8) and isinstance(o.cost_prompt, float) and isinstance(o.budget, float)
    assert type(o.seed) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.seed = 4  # type: ignore[misc]
    assert VarianceOptions(**o.keywords()) == o
    assert o.replace(n_boot=0).n_boot == 0 and o.n_boot == 1000


def test_of_takes_the_object_or_the_keywords_not_both():
    o = VarianceOptions(n_boot=0)
    assert VarianceOptions.of(o) is o
    assert VarianceOptions.of(n_boot=0) == o
    with pytest.raises(MrtInputError, match="not both"):
        VarianceOptions.of(o, seed=1)
    with pytest.raises(MrtInputError, match=r"unknown variance option\(s\) \['n_bootstrap'\]"):
        VarianceOptions.of(n_bootstrap=5)
    with pytest.raises(MrtInputError, match="must be a VarianceOptions"):
        VarianceOptions.of({"n_boot": 0})


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), n_boot=st.sampled_from([0, 30]), cp=st.floats(0.1, 10),
       budget=st.one_of(st.none(), st.floats(10, 1e4)))
def test_the_options_object_gives_the_keywords_report(seed, n_boot, cp, budget):
    df = _pilot(seed=seed)
    acc = VarianceAccumulator().update(df["prompt_id"], df["loss"])
    kw = dict(n_boot=n_boot, cost_prompt=cp, budget=budget, seed=seed, loss_bound=5.0)
    by_keywords = report_from_accumulator(acc, **kw)
    _same(report_from_accumulator(acc, VarianceOptions(**kw)), by_keywords)
    _same(acc.report(VarianceOptions(**kw)), by_keywords)
    _same(variance_budget(df, **kw), by_keywords)
