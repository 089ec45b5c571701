"""Warm pilots (mrt_fast.llm.warm_pilot) and shared-prefix losses (mrt_fast.llm.prefix_loss) on the tiny offline
model: the prefix losses equal pair_losses, the warm-up never sees a scored prompt, and a LoRA warm-up lowers
the pilot's loss on the task format."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.train


def _task(n_prompts, offset=0, per=3):
    rows = [(f"p{i}", f"Name a number between {10 * i} and {10 * i + 9}.\n", str(10 * i + 1 + j))
            for i in range(offset, offset + n_prompts) for j in range(per)]
    return pl.DataFrame(rows, schema=["prompt_id", "prompt", "response"], orient="row")


@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.text("abc xyz.19", min_size=1, max_size=10)), min_size=1,
                max_size=10),
       st.sampled_from(["plain", "chat"]), st.integers(1, 3))
def test_prefix_losses_equal_pair_losses(chat_lm, pairs, fmt, batch):
    from mrt_fast.llm.loss import pair_losses
    from mrt_fast.llm.models import load_causal_lm, load_tokenizer
    from mrt_fast.llm.prefix_loss import prefix_pair_losses

    tok, net = load_tokenizer(str(chat_lm)), load_causal_lm(str(chat_lm))
    prompts = ["Say a word.", "Name a colour: red, green", "The quick brown fox", ""][:4]
    p = [prompts[i] for i, _ in pairs]
    r = [t for _, t in pairs]
    want, wn = pair_losses(net, tok, p, r, prompt_format=fmt, return_counts=True)
    got, gn = prefix_pair_losses(net, tok, p, r, prompt_format=fmt, batch_size=batch, return_counts=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (gn == wn).all()


def test_lora_warm_up_refuses_scored_prompts(chat_lm, tmp_path):
    from mrt_fast.errors import MrtInputError
    from mrt_fast.llm.warm_pilot import warm_up

    scored = _task(4)
    warm = pl.concat([_task(4, offset=10), scored.head(1)])  # one scored prompt slipped in
    with pytest.raises(MrtInputError, match="shares 1 prompt"):
        warm_up(str(chat_lm), "lora", scored_prompts=scored["prompt"].to_list(), warm_data=warm, steps=1,
                work_dir=tmp_path)
    assert not (tmp_path / "adapter").exists()  # nothing trained


def test_warm_modes_check_their_inputs(chat_lm, tiny_paths):
    from mrt_fast.errors import MrtInputError
    from mrt_fast.llm.warm_pilot import warm_up

    with pytest.raises(MrtInputError, match="no chat template"):
        warm_up(str(tiny_paths["lm"]), "chat", scored_prompts=[])
    with pytest.raises(MrtInputError, match="needs warm-up data"):
        warm_up(str(chat_lm), "lora", scored_prompts=[])
    with pytest.raises(MrtInputError, match="one of"):
        warm_up(str(chat_lm), "hot", scored_prompts=[])
    assert warm_up(str(chat_lm), "chat", scored_prompts=[]).prompt_format == "chat"


def test_lora_warm_pilot_lowers_the_task_loss_and_trains_only_on_warm_prompts(chat_lm, tmp_path):
    from mrt_fast.llm.warm_pilot import warm_pilot_table

    scored = _task(6).with_columns(pl.int_range(pl.len()).alias("candidate_index"))
    warm = _task(8, offset=20)
    assert set(warm["prompt"]).isdisjoint(scored["prompt"])
    base, s0 = warm_pilot_table(scored, str(chat_lm), "none", prompt_format="chat")
    warmed, s1 = warm_pilot_table(scored, str(chat_lm), "lora", warm_data=warm, steps=20, learning_rate=3e-2,
                                  work_dir=tmp_path / "warm", prompt_format="chat")
    assert s0.adapter is None and s1.adapter is not None and s1.prompt_format == "chat"
    assert s1.warm_prompts == 8
    # the warm-up's data: exactly the warm prompts (the run records its pair count)
    import json

    meta = json.loads((tmp_path / "warm" / "train_config.json").read_text())
    assert meta["n_pairs"] == warm.height and meta["n_prompts"] == 8
    assert warmed["loss"].mean() < base["loss"].mean() - 0.2
    assert warmed.drop("loss").equals(scored) and base.drop("loss").equals(scored)


def test_mrt_nll_warm_pilot(chat_lm, tmp_path):
    from typer.testing import CliRunner

    from mrt_fast.cli import app

    scored, warm = _task(3), _task(4, offset=10)
    scored.write_parquet(tmp_path / "in.parquet")
    warm.write_parquet(tmp_path / "warm.parquet")
    base = ["nll", str(tmp_path / "in.parquet"), None, "--model", str(chat_lm), "--device", "cpu",
            "--prompt-format", "plain"]

    def run(out, *extra):
        return CliRunner().invoke(app, [*base[:2], str(tmp_path / out), *base[3:], *extra])

    outs = {}
    for mode, extra in {"none": [], "chat": ["--warm-pilot", "chat"],
                        "lora": ["--warm-pilot", "lora", "--warm-data", str(tmp_path / "warm.parquet"),
                                 "--warm-steps", "2"]}.items():
        r = run(f"{mode}.parquet", *extra)
        assert r.exit_code == 0, r.output
        outs[mode] = pl.read_parquet(tmp_path / f"{mode}.parquet")
        assert outs[mode].drop("loss").equals(scored)
    assert not np.allclose(outs["none"]["loss"], outs["chat"]["loss"])  # the chat template changes the scores
    assert not np.allclose(outs["chat"]["loss"], outs["lora"]["loss"])  # and so does the warm-up
    # a warm-up on scored prompts, or without data, is refused with one line
    pl.concat([warm, scored.head(1)]).write_parquet(tmp_path / "bad.parquet")
    r = run("bad_out.parquet", "--warm-pilot", "lora", "--warm-data", str(tmp_path / "bad.parquet"))
    assert r.exit_code != 0 and "shares 1 prompt" in r.output and "Traceback" not in r.output
    r = run("bad_out.parquet", "--warm-pilot", "lora")
    assert r.exit_code != 0 and "needs --warm-data" in r.output
    r = run("bad_out.parquet", "--warm-pilot", "warm")
    assert r.exit_code != 0 and "--warm-pilot must be one of" in r.output
    assert not (tmp_path / "bad_out.parquet").exists()
