"""The diagnose plot: K as plain integers, the costs in the title, and the K beyond the pilot's
marked as extrapolated."""

from __future__ import annotations

import re

import numpy as np
import polars as pl
import pytest


def _pilot(k: int, n_prompts: int = 40, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(n_prompts), k)
    return pl.DataFrame({"prompt_id": ids, "loss": 0.5 * rng.normal(size=n_prompts)[ids] + rng.normal(size=ids.size)})


@pytest.mark.parametrize("budget", [None, 400.0])
def test_the_plot_labels_k_plainly_names_the_costs_and_marks_the_extrapolated_ks(budget):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mrt_fast.variance import variance_budget

    rep = variance_budget(_pilot(8), n_boot=50, cost_prompt=4, cost_response=0.5, budget=budget)
    assert rep.pilot_k_max == 8 and rep.to_dict()["pilot_k_max"] == 8
    fig = rep.plot(k_max_plot=64)
    try:
        fig.canvas.draw()
        title = fig._suptitle.get_text()
        assert "C_p = 4" in title and "C_r = 0.5" in title and "K <= 8" in title, title
        for ax in fig.axes:
            lo, hi = ax.get_xlim()
            labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text() and lo <= t.get_position()[0] <= hi]
            assert labels and all(re.fullmatch(r"\d+", t) for t in labels), labels  # 1 2 4 ... 64, no 2^k
            assert {"1", "8", "64"} <= set(labels)
            ys = [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True) if t.get_text()]
            assert not any("10^" in t or "times" in t or "\\" in t for t in ys), ys
            spans = [p for p in ax.patches if "beyond the pilot" in str(p.get_label())]
            assert len(spans) == 1
            assert (spans[0].get_x(), spans[0].get_x() + spans[0].get_width()) == (8, 64)
    finally:
        plt.close(fig)
