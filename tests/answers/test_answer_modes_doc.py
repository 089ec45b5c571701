"""docs/guides/modes.md shows the answer-modes benchmark's committed results, and the benchmark's
measures see what they should."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

import bench_answer_modes as bam  # noqa: E402


def test_the_table_in_modes_md_is_generated_from_the_results_file():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "experiments" / "bench_answer_modes.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_check_sees_a_changed_table(tmp_path, monkeypatch):
    import json

    doc = json.loads(bam.RESULTS.read_text())
    name = next(iter(doc["sets"]))
    doc["sets"][name]["answer_keys"]["ari"] += 0.5
    assert not bam.write_doc(doc, check=True)


def test_math_pools_state_their_answers_and_the_keys_find_them():
    import mrt_fast

    df = bam.math_pools(12, 10, seed=1)
    out = mrt_fast.answers(df, reference="gold")
    stated = out.filter(pl.col("stated"))
    # every response that states its answer gets the key of its planted mode, one key per mode
    per = stated.group_by("prompt_id", "mode_true").agg(pl.col("answer").n_unique().alias("keys"))
    assert (per["keys"] == 1).all()
    right = stated.filter(pl.col("mode_true") == 0)
    assert right["correct"].all() and not stated.filter(pl.col("mode_true") > 0)["correct"].any()
    assert bam.per_pool_ari(out.with_columns(pl.col("mode_true").alias("same")), "same")["ari"] == 1.0
    assert np.isclose(bam.per_pool_ari(out, "mode")["ari_stated"], 1.0)
