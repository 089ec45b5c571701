"""The figures of `mrt simulate`: a quick run says so on each figure."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("quick", [True, False])
def test_quick_run_figures_are_titled_as_such(tmp_path, monkeypatch, quick):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mrt_fast.simulate.report import plot_all

    titles = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (titles.extend(a.get_title() for a in fig.axes),
                                                        real_close(fig)))
    res = {"quick": quick, "variance_law": {"ks": [1, 2, 4, 8], "measured_variance": [0.04, 0.03, 0.025, 0.022],
                                            "v_x": 0.8, "v_y_given_x": 1.2, "n_prompts": 40, "prompt_floor": 0.02}}
    paths = plot_all(res, tmp_path)
    assert [p.name for p in paths] == ["fig_a_variance.png"] and paths[0].exists()
    assert titles and all(t.endswith("(quick run)") == quick for t in titles), titles
