"""mrt run's results: the cells of its grid (those of earlier runs outside it kept on disk, not
reported), identical cells trained once and
flagged, intervals over the evaluation prompts in the table and the plot."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

pytestmark = [pytest.mark.train, pytest.mark.usefixtures("torch_one_thread")]


def _cfg(tmp_path, tiny_paths, methods, ks, out="out"):
    from mrt_fast.llm.testing import tiny_prompt_table

    tiny_prompt_table(3, with_reference=False).write_ndjson(tmp_path / "train.jsonl")
    tiny_prompt_table(3, offset=5).write_ndjson(tmp_path / "eval.jsonl")
    return {"out_dir": str(tmp_path / out), "model": str(tiny_paths["lm"]), "reward_model": str(tiny_paths["reward"]),
            "embedder": "hashing", "data": {"train_prompts": str(tmp_path / "train.jsonl"),
                                             "eval": str(tmp_path / "eval.jsonl")},
            "generate": {"n": 3, "max_new_tokens": 4}, "select": {"methods": methods, "ks": ks},
            "train": {"max_steps": 1}, "evaluate": {"n_samples": 2, "max_new_tokens": 4}, "threads": 1}


def test_identical_cells_train_once_and_are_flagged(tiny_paths, tmp_path, monkeypatch):
    """K = the pool size: random and grades keep every row (in their pick order): one model, flagged."""
    import mrt_fast.llm.train as train_mod
    from mrt_fast.llm.pipeline import run

    trained = []
    real = train_mod.train
    monkeypatch.setattr(train_mod, "train", lambda data, model, out, *a, **kw: (trained.append(out),
                                                                               real(data, model, out, *a, **kw))[1])
    res = run(_cfg(tmp_path, tiny_paths, ["random", "grades"], [1, 3]), progress=False)
    out = tmp_path / "out"
    a, b = (pl.read_parquet(out / "select" / f"{m}_k3.parquet") for m in ("random", "grades"))
    assert a.select("prompt_id", "response").sort("prompt_id", "response").equals(
        b.select("prompt_id", "response").sort("prompt_id", "response"))
    assert sorted(p.name for p in trained) == ["grades_k1", "random_k1", "random_k3"]
    row = res.filter((pl.col("method") == "grades") & (pl.col("K") == 3)).row(0, named=True)
    assert row["same_as"] == "random_k3" and row["cell"] == "reused"
    twin = res.filter((pl.col("method") == "random") & (pl.col("K") == 3)).row(0, named=True)
    assert twin["same_as"] is None and twin["cell"] == "new" and row["ref_loss"] == twin["ref_loss"]
    assert not (out / "runs" / "grades_k3" / "adapter").exists()
    assert json.loads((out / "runs" / "grades_k3" / "metrics.json").read_text())["same_as"] == "random_k3"
    assert res.filter(pl.col("same_as").is_not_null()).height == 1
    # intervals over the 3 evaluation prompts: in the table and the markdown
    for met in ("ref_loss", "coverage", "diversity", "reward"):
        assert res[f"{met}_se"].is_finite().all() and (res[f"{met}_se"] > 0).all()
    assert "±" in (out / "results.md").read_text()


def test_the_key_of_kept_rows_ignores_order_but_not_content_or_weight():
    from mrt_fast.llm.cells import kept_key

    kept = pl.DataFrame({"prompt_id": [1, 1, 2], "prompt": ["a", "a", "b"], "response": ["x", "y", "z"]})
    assert kept_key(kept) == kept_key(kept.reverse()) == kept_key(kept.with_columns(pl.lit(1.0).alias("weight")))
    assert kept_key(kept) != kept_key(kept.with_columns(pl.Series("weight", [1.0, 2.0, 1.0])))
    assert kept_key(kept) != kept_key(kept.with_columns(pl.Series("response", ["x", "y", "w"])))
    assert kept_key(kept) != kept_key(kept.head(2))


def test_results_hold_the_grid_and_mark_reused_cells(tiny_paths, tmp_path):
    from mrt_fast.llm.pipeline import run

    first = run(_cfg(tmp_path, tiny_paths, ["random"], [1]), progress=False)
    assert first.select("method", "K", "cell").rows() == [("base", 0, "new"), ("random", 1, "new")]
    second = run(_cfg(tmp_path, tiny_paths, ["random"], [2]), progress=False)
    assert second.select("method", "K", "cell").rows() == [("base", 0, "reused"), ("random", 2, "new")]
    assert (tmp_path / "out" / "runs" / "random_k1" / "metrics.json").exists()  # kept on disk
    on_disk = pl.read_csv(tmp_path / "out" / "results.csv")
    assert on_disk.select("method", "K", "cell").rows() == second.select("method", "K", "cell").rows()
    third = run(_cfg(tmp_path, tiny_paths, ["random"], [1, 2]), progress=False)  # back in the grid: reused
    assert third.select("method", "K", "cell").rows() == [("base", 0, "reused"), ("random", 1, "reused"),
                                                          ("random", 2, "reused")]
    assert third.filter(pl.col("K") == 1)["ref_loss"].item() == first.filter(pl.col("K") == 1)["ref_loss"].item()


def test_the_results_plot_draws_intervals_and_identical_cells(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.container import ErrorbarContainer
    from matplotlib.figure import Figure

    from mrt_fast.llm.pipeline import plot_results

    res = pl.DataFrame({"method": ["base", "random", "random", "grades", "grades"], "K": [0, 1, 4, 1, 4],
                        "ref_loss": [2.0, 1.8, 1.7, 1.75, 1.7], "ref_loss_se": [0.1, 0.05, 0.04, 0.05, 0.04],
                        "coverage": [0.5, 0.6, 0.62, 0.61, 0.62], "coverage_se": [0.01] * 5,
                        "cell": ["new"] * 4 + ["reused"], "same_as": [None, None, None, None, "random_k4"]})
    figs = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **kw: figs.append(self))
    plot_results(res, tmp_path / "r.png")
    ax = figs[0].axes[0]
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2
    seg = bars[0].lines[2][0].get_segments()  # random's intervals: mean +- 1.96 se
    assert [s[1][1] - s[0][1] for s in seg] == pytest.approx([2 * 1.96 * 0.05, 2 * 1.96 * 0.04])
    xs = [np.asarray(b.lines[0].get_xdata(), dtype=float) for b in bars]
    assert not np.allclose(xs[0], xs[1])  # methods side by side: equal values stay visible
    assert any(t.get_text() == "= random_k4" for t in ax.texts)
    assert any(abs(p.get_height() - 2 * 1.96 * 0.1) < 1e-9 for p in ax.patches if hasattr(p, "get_height"))


def test_the_results_plot_labels_k_plainly_and_names_the_number_of_eval_prompts(tmp_path, monkeypatch):
    import re

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from mrt_fast.llm.pipeline import plot_results

    res = pl.DataFrame({"method": ["base", "random", "random", "random"], "K": [0, 1, 2, 8],
                        "ref_loss": [2.0, 1.8, 1.7, 1.6], "ref_loss_se": [0.1, 0.05, 0.04, 0.04]})
    figs = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **kw: figs.append(self))
    plot_results(res, tmp_path / "r.png", n_prompts=37)
    fig = figs[0]
    fig.canvas.draw()
    assert "37 evaluation prompts" in fig._suptitle.get_text()
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text() and lo <= t.get_position()[0] <= hi]
    assert {"1", "2", "8"} <= set(labels) and all(re.fullmatch(r"\d+", t) for t in labels), labels


def test_standard_errors_over_prompts_by_hand():
    from mrt_fast.llm.evaluate import ratio_standard_error, standard_error

    v = [0.2, 0.4, 0.9]
    assert standard_error(v) == pytest.approx(np.std(v, ddof=1) / np.sqrt(3))
    assert np.isnan(standard_error([1.0]))
    x, n = np.array([3.0, 10.0, 4.0]), np.array([2.0, 5.0, 4.0])
    r = x.sum() / n.sum()
    want = np.sqrt(np.sum((x - r * n) ** 2) / 6) / n.mean()
    assert ratio_standard_error(x, n) == pytest.approx(want)
    assert ratio_standard_error(2 * n, n) == pytest.approx(0.0)  # every prompt at the same loss
