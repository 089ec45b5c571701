"""mrt demo's bar charts: bars from 0 with intervals over the prompts, never a y axis cut to
exaggerate small differences."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mrt_fast.cli import app


@pytest.mark.embed
def test_demo_bars_start_at_zero_with_intervals(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.container import BarContainer
    from matplotlib.figure import Figure

    figs = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **kw: (figs.append(self), real(self, *a, **kw))[1])
    r = CliRunner().invoke(app, ["demo", "--out-dir", str(tmp_path / "d"), "--max-prompts", "3",
                                 "--cache-dir", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "d" / "metrics.json").read_text())
    axes = figs[0].axes
    assert len(axes) == 3
    for ax, key in zip(axes, ("coverage", "diversity", "reward")):
        bars = [c for c in ax.containers if isinstance(c, BarContainer)][0]
        assert [b.get_y() for b in bars] == [0.0] * len(m)  # every bar grows from 0
        assert [b.get_height() for b in bars] == pytest.approx([m[s][key] for s in m])
        lo, hi = ax.get_ylim()
        assert lo <= 0.0 <= hi
        assert bars.errorbar is not None  # intervals over the prompts
