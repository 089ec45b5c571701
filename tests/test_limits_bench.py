"""The memory-limit benchmark (bench/perf/bench_limits.py, limits_doc.py): a miniature run end to end, from
the refused minimum up, and the page and plot made from it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "perf"))

import bench_limits  # noqa: E402
import limits_doc  # noqa: E402


def test_a_miniature_run_starts_at_the_refused_minimum_and_makes_its_page(tmp_path):
    out = tmp_path / "l.json"
    assert bench_limits.main(["--size", "4000", "--files", "2", "--dim", "4", "--limits", "900MB",
                              "--repeats", "1", "--workdir", str(tmp_path / "w"), "--out", str(out)]) == 0
    b = json.loads(out.read_text())
    limits = [r["limit_bytes"] for r in b["results"]]
    assert limits == sorted(limits) and limits[0] == b["least_limit_bytes"] > 0
    assert limits[1] == int(1.5 * limits[0]) and 900_000_000 in limits
    for r in b["results"]:
        assert r["seconds"] > 0 and r["parts"] >= 1 and r["peak_rss_over_limit"] < 1.0
        # one round: the ratio is that round's wall over the floor's
        assert r["ratio_runs"] == [r["runs_seconds"][0] / b["floor"]["runs_seconds"][0]]
        assert abs(r["ratio_to_floor"] - r["seconds"] / b["floor"]["seconds"]) < 1e-9
    text = limits_doc.render(b)
    assert "](limits.png)" in text and text.count("\n| ") == len(limits) + 1
    limits_doc.plot(b, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
