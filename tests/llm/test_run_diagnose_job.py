"""The advisor's pilot losses (``select.ks: auto``) are the nll stage of the dataset job: they equal
the in-memory losses, a stopped pilot resumes from its finished parts, and a warm pilot's
adapter is the one the job started with."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

pytestmark = [pytest.mark.train, pytest.mark.usefixtures("torch_one_thread")]

#: 4 prompts x 3 responses in parts of 5 pairs: 3 parts
ROWS = 5


def _pairs() -> pl.DataFrame:
    rng = np.random.default_rng(3)
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"]
    rows = [(p, f"prompt {p} says", " ".join(rng.choice(words, size=int(rng.integers(1, 5)))))
            for p in range(4) for _ in range(3)]
    return pl.DataFrame(rows, schema=["prompt_id", "prompt", "response"], orient="row")


def _diagnose(model, out, **kw):
    from mrt_fast.llm.advisor import diagnose

    return diagnose(_pairs(), str(model), out, cost_prompt=4.0, cost_response=1.0, k_max=3, n_boot=50,
                    max_length=64, progress=False, rows_per_part=ROWS, **kw)


def test_pilot_losses_equal_the_in_memory_losses_and_leave_no_parts(tiny_paths, tmp_path):
    from mrt_fast.llm.loss import pair_losses
    from mrt_fast.llm.models import load_causal_lm, load_tokenizer

    _diagnose(tiny_paths["lm"], tmp_path / "d")
    got = pl.read_parquet(tmp_path / "d" / "losses.parquet")
    pairs = _pairs()
    assert got.columns == ["prompt_id", "loss"] and got["prompt_id"].to_list() == pairs["prompt_id"].to_list()
    lm = str(tiny_paths["lm"])
    want = pair_losses(load_causal_lm(lm), load_tokenizer(lm), pairs["prompt"].to_list(),
                       pairs["response"].to_list(), max_length=64, device="cpu", progress=False)
    np.testing.assert_allclose(got["loss"].to_numpy(), np.asarray(want), rtol=1e-5)
    left = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert left == ["losses.parquet", "report.json", "variance.png", "warm.json"]


def test_a_stopped_pilot_resumes_from_its_finished_parts(tiny_paths, tmp_path):
    from mrt_fast.datasets.job import StoppedForTest, stopping_after

    whole = _diagnose(tiny_paths["lm"], tmp_path / "whole")
    out = tmp_path / "stopped"
    with stopping_after(2), pytest.raises(StoppedForTest):
        _diagnose(tiny_paths["lm"], out)
    parts = out / "losses.parquet.parts"
    assert sorted(p.name for p in parts.glob("part-*.parquet")) == ["part-00000.parquet", "part-00001.parquet"]
    assert not (out / "losses.parquet").exists() and (out / "pairs.parquet").exists()
    seen: list[int] = []
    import mrt_fast.llm.nll as nll

    real = nll.nll_table

    def counting(df, *a, **k):
        seen.append(df.height)
        return real(df, *a, **k)

    mp = pytest.MonkeyPatch()
    mp.setattr(nll, "nll_table", counting)
    try:
        again = _diagnose(tiny_paths["lm"], out)
    finally:
        mp.undo()
    assert seen == [12 - 2 * ROWS]  # only the part still missing is scored
    assert not parts.exists() and not (out / "pairs.parquet").exists()
    a = pl.read_parquet(tmp_path / "whole" / "losses.parquet")
    b = pl.read_parquet(out / "losses.parquet")
    np.testing.assert_allclose(b["loss"].to_numpy(), a["loss"].to_numpy(), rtol=1e-6)
    assert again["v_x"] == pytest.approx(whole["v_x"]) and again["k_best"] == whole["k_best"]


def test_chat_pilot_equals_the_warm_pilot_table(chat_lm, tmp_path):
    from mrt_fast.llm.warm_pilot import warm_pilot_table

    advice = _diagnose(chat_lm, tmp_path / "d", warm_pilot="chat")
    got = pl.read_parquet(tmp_path / "d" / "losses.parquet")["loss"].to_numpy()
    want, _ = warm_pilot_table(_pairs(), str(chat_lm), "chat")
    np.testing.assert_allclose(got, want["loss"].to_numpy(), rtol=1e-5)
    assert advice["warm_pilot"] == "chat"
    assert json.loads((tmp_path / "d" / "warm.json").read_text())["prompt_format"] == "chat"


def test_a_stopped_lora_pilot_keeps_the_adapter_it_started_with(chat_lm, tmp_path):
    from mrt_fast.datasets.job import StoppedForTest, stopping_after

    warm = pl.DataFrame({"prompt_id": [10, 10, 11], "prompt": ["other a", "other a", "other b"],
                         "response": ["the cat", "a dog", "on the mat"]})
    out = tmp_path / "d"
    with stopping_after(1), pytest.raises(StoppedForTest):
        _diagnose(chat_lm, out, warm_pilot="lora", warm_data=warm, warm_steps=1)
    state = json.loads((out / "warm.json").read_text())
    adapter = out / "warm" / "adapter"
    assert state["mode"] == "lora" and state["adapter"] == str(adapter)
    stamp = {p.name: p.stat().st_mtime_ns for p in adapter.iterdir()}
    advice = _diagnose(chat_lm, out, warm_pilot="lora", warm_data=warm, warm_steps=1)
    assert {p.name: p.stat().st_mtime_ns for p in adapter.iterdir()} == stamp  # not trained again
    assert advice["warm_pilot"] == state["tag"]
    # the losses are the warmed model's: they differ from the chat pilot's
    chat = tmp_path / "chat"
    _diagnose(chat_lm, chat, warm_pilot="chat")
    a = pl.read_parquet(out / "losses.parquet")["loss"].to_numpy()
    b = pl.read_parquet(chat / "losses.parquet")["loss"].to_numpy()
    assert not np.allclose(a, b)


@pytest.mark.ray
def test_pilot_losses_on_ray_equal_the_local_ones(tiny_paths, tmp_path):
    pytest.importorskip("ray")
    local = _diagnose(tiny_paths["lm"], tmp_path / "local")
    on_ray = _diagnose(tiny_paths["lm"], tmp_path / "ray", engine="ray")
    a = pl.read_parquet(tmp_path / "local" / "losses.parquet")
    b = pl.read_parquet(tmp_path / "ray" / "losses.parquet")
    assert b["prompt_id"].to_list() == a["prompt_id"].to_list()
    np.testing.assert_allclose(b["loss"].to_numpy(), a["loss"].to_numpy(), rtol=1e-5)
    assert on_ray["k_best"] == local["k_best"] and not (tmp_path / "ray" / "losses.parquet.parts").exists()
