"""The LLM pipeline on tiny offline models: masking, weighting, matched steps, pass@k
(programs run in the sandbox, tested on its own in test_sandbox.py), resumable
generation and the runner end to end."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrt_fast import MrtInputError

pytestmark = [pytest.mark.train, pytest.mark.usefixtures("torch_one_thread")]


@pytest.fixture(scope="module")
def tok():
    from mrt_fast.llm.testing import tiny_tokenizer

    return tiny_tokenizer()


# ------------------------------------------------------------------ masking


def test_prompt_tokens_are_masked(tok):
    from mrt_fast.llm.train import build_example

    p_ids = tok("The quick brown").input_ids
    r_ids = tok(" fox jumps", add_special_tokens=False).input_ids
    ex = build_example(tok, "The quick brown", " fox jumps", max_length=512, prompt_format="plain")
    assert ex["input_ids"] == p_ids + r_ids + [tok.eos_token_id]
    assert ex["labels"] == [-100] * len(p_ids) + r_ids + [tok.eos_token_id]


def test_prompt_positions_do_not_affect_the_loss(tok):
    import torch

    from mrt_fast.llm.testing import tiny_causal_lm
    from mrt_fast.llm.train import build_example, collate, sequence_losses

    model = tiny_causal_lm(tok)
    ex = [build_example(tok, "Paris is the", " capital of France", 512, "plain"),
          build_example(tok, "A journey of a thousand", " miles", 512, "plain")]
    ids, mask, labels = collate(ex, tok.pad_token_id)
    logits = model(input_ids=ids, attention_mask=mask).logits.detach().clone().requires_grad_(True)
    loss, counts = sequence_losses(logits, labels)
    loss.sum().backward()
    # logits at t predict token t+1: positions whose next label is -100 (prompt, padding) get no gradient
    scored = torch.zeros_like(labels, dtype=torch.bool)
    scored[:, :-1] = labels[:, 1:] != -100
    assert logits.grad[~scored].abs().max() == 0
    assert logits.grad[scored].abs().sum(-1).min() > 0
    # and perturbing them leaves the loss unchanged
    pert = logits.detach().clone()
    pert[~scored] += 10 * torch.randn_like(pert[~scored])
    loss2, _ = sequence_losses(pert, labels)
    torch.testing.assert_close(loss2, loss.detach())
    # token-mean per response, scored tokens = response tokens + EOS
    resp_len = [sum(1 for x in e["labels"] if x != -100) for e in ex]
    assert counts.tolist() == resp_len


# ------------------------------------------------------------------ per-prompt weighting


def test_pair_weights_make_prompts_equal():
    from mrt_fast.llm.train import mrt_objective, pair_weights

    pids = ["a", "a", "a", "a", "b"]
    losses = np.array([1.0, 2.0, 3.0, 4.0, 10.0])
    # (1/2) * [(1+2+3+4)/4 + 10/1] = 6.25; a pair mean would give 4.0
    assert mrt_objective(losses, pids) == pytest.approx(6.25)
    w = pair_weights(pids)
    np.testing.assert_allclose(w, [5 / 8] * 4 + [5 / 2])
    assert w.mean() == pytest.approx(1.0)
    np.testing.assert_allclose(pair_weights(pids, per_prompt=False), 1.0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=8), st.integers(0, 10**6))
def test_mrt_objective_is_mean_of_prompt_means(ks, seed):
    from mrt_fast.llm.train import mrt_objective

    rng = np.random.default_rng(seed)
    pids = [f"p{i}" for i, k in enumerate(ks) for _ in range(k)]
    losses = rng.uniform(0, 5, len(pids))
    per_prompt = [losses[np.array(pids) == f"p{i}"].mean() for i in range(len(ks))]
    assert mrt_objective(losses, pids) == pytest.approx(np.mean(per_prompt), rel=1e-12)


def test_one_step_loss_matches_hand_computed_value(tok, tmp_path):
    """One optimizer step over an epoch of pairs logs exactly the per-prompt average of token-mean losses."""
    import torch

    from mrt_fast.llm.testing import tiny_causal_lm
    from mrt_fast.llm.train import build_example, collate, sequence_losses, train

    df = pl.DataFrame({"prompt_id": ["a"] * 4 + ["b"],
                       "prompt": ["The quick"] * 4 + ["Paris is"],
                       "response": [" brown fox", " red fox", " lazy dog", " cat", " the capital of France"]})
    model = tiny_causal_lm(tok, seed=3)
    with torch.no_grad():
        per = []
        for p, r in zip(df["prompt"], df["response"]):
            ids, mask, labels = collate([build_example(tok, p, r, 512, "plain")], tok.pad_token_id)
            per.append(float(sequence_losses(model(input_ids=ids, attention_mask=mask).logits, labels)[0][0]))
    expected = 0.5 * (np.mean(per[:4]) + per[4])
    res = train(df, model, tmp_path / "run", tokenizer=tok, max_steps=1, grad_accum=5, batch_size=1,
                lora_dropout=0.0, prompt_format="plain", progress=False)
    assert res.log[0]["loss"] == pytest.approx(expected, rel=1e-5)
    # the plain pair mean differs, so the test can tell the two objectives apart
    assert abs(np.mean(per) - expected) > 1e-3
    logged = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert logged[0]["step"] == 1 and {"loss", "lr"} <= set(logged[0])
    assert (res.adapter_dir / "adapter_config.json").exists()


# ------------------------------------------------------------------ matched steps


@pytest.mark.parametrize("k", [1, 2, 4])
def test_matched_optimizer_steps_across_k(tok, tmp_path, k):
    from mrt_fast.llm.testing import tiny_causal_lm
    from mrt_fast.llm.train import step_schedule, train

    rows = [{"prompt_id": f"p{i}", "prompt": f"Question {i}:", "response": f" answer {j}"}
            for i in range(3) for j in range(k)]
    res = train(pl.DataFrame(rows), tiny_causal_lm(tok), tmp_path / f"k{k}", tokenizer=tok,
                max_steps=3, grad_accum=2, progress=False)
    assert res.steps == 3 and [r["step"] for r in res.log] == [1, 2, 3]
    assert res.epochs == pytest.approx(3 * 2 / (3 * k))  # the same pairs drawn, whatever the data size
    sched = step_schedule(3 * k, 1, 2, 3, seed=0)
    assert len(sched) == 3 and all(len(s) == 2 for s in sched)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(1, 4), st.integers(1, 5), st.integers(1, 6))
def test_step_schedule_covers_epochs(n, bs, ga, steps):
    from mrt_fast.llm.train import step_schedule

    sched = step_schedule(n, bs, ga, steps, seed=1)
    flat = [i for s in sched for mb in s for i in mb]
    assert len(sched) == steps and len(flat) == steps * bs * ga
    for e in range(len(flat) // n):  # every complete epoch is a permutation
        assert sorted(flat[e * n : (e + 1) * n]) == list(range(n))


def test_train_rejects_bad_input(tok, tmp_path):
    from mrt_fast.llm.testing import tiny_causal_lm
    from mrt_fast.llm.train import TrainConfig, train

    with pytest.raises(MrtInputError, match="response"):
        train(pl.DataFrame({"prompt_id": ["a"], "prompt": ["x"]}), tiny_causal_lm(tok), tmp_path, tokenizer=tok)
    with pytest.raises(MrtInputError, match="target_modules"):
        train(pl.DataFrame({"prompt_id": ["a"], "prompt": ["x"], "response": ["y"]}), tiny_causal_lm(tok),
              tmp_path, tokenizer=tok, target_modules=["c_attn"], max_steps=1)
    with pytest.raises(MrtInputError, match="unknown train option"):
        TrainConfig.from_dict({"lr": 1.0})


# ------------------------------------------------------------------ pass@k


def _exact_enumeration(n, c, k):
    hits = sum(1 for s in itertools.combinations(range(n), k) if any(i < c for i in s))
    return Fraction(hits, math.comb(n, k))


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 10).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_matches_enumeration(nck):
    from mrt_fast.llm.evaluate import pass_at_k

    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(float(_exact_enumeration(n, c, k)), rel=1e-12, abs=1e-15)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5000).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_large_n_matches_exact_binomials(nck):
    from mrt_fast.llm.evaluate import pass_at_k

    n, c, k = nck
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-9, abs=1e-300)


def test_pass_at_k_vectorised_and_validated():
    from mrt_fast.llm.evaluate import pass_at_k

    out = pass_at_k(np.array([16, 16, 16]), np.array([0, 1, 16]), 4)
    np.testing.assert_allclose(out, [0.0, 4 / 16, 1.0])
    assert isinstance(pass_at_k(10, 3, 1), float) and pass_at_k(10, 3, 1) == pytest.approx(0.3)
    for bad in [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6), (5.5, 2, 1)]:
        with pytest.raises(MrtInputError):
            pass_at_k(*bad)


# ------------------------------------------------------------------ generation


def test_generation_logprobs_match_teacher_forcing(tok, tmp_path):
    import torch

    from mrt_fast.llm.generate import generate
    from mrt_fast.llm.testing import tiny_causal_lm, tiny_prompt_table

    model = tiny_causal_lm(tok)
    prompts = tiny_prompt_table(4, with_reference=False)
    df = generate(prompts, tmp_path / "c.parquet", model, tokenizer=tok, n=6, max_new_tokens=6,
                  prompt_format="plain", progress=False)
    assert df.height == 24 and df["candidate_index"].to_list() == list(range(6)) * 4
    assert set(df["finish_reason"]) <= {"stop", "length"}
    # generation runs on the device asked (auto: CUDA when present, in bfloat16 there)
    on = next(model.parameters())
    tol = 1e-3 if on.dtype == torch.float32 else 5e-2
    checked = 0
    for row in df.iter_rows(named=True):
        p = tok(row["prompt"]).input_ids
        r = tok(row["response"], add_special_tokens=False).input_ids
        if row["finish_reason"] == "stop":
            r = r + [tok.eos_token_id]
        if len(r) != row["n_tokens"]:  # a byte-level decode/encode round trip can re-merge tokens
            continue
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([p + r], device=on.device)).logits[0].float(), -1)
        tf = sum(float(lp[len(p) - 1 + t, r[t]]) for t in range(len(r)))
        assert row["logprob"] == pytest.approx(tf, abs=tol)
        checked += 1
    assert checked >= 1
    assert (df["logprob"] < 0).all()


def test_generation_resumes_without_duplicates_or_losses(tiny_paths, tmp_path):
    from mrt_fast.llm.generate import generate, parts_dir
    from mrt_fast.llm.testing import tiny_prompt_table

    prompts = tiny_prompt_table(5, with_reference=False)
    kw = dict(n=3, max_new_tokens=5, shard_prompts=2, progress=False)
    full = generate(prompts, tmp_path / "full.parquet", str(tiny_paths["lm"]), **kw)
    out = tmp_path / "part.parquet"
    with pytest.raises(KeyboardInterrupt):  # killed after the first shard (2 prompts) was written
        generate(prompts, out, str(tiny_paths["lm"]), _stop_after_shards=1, **kw)
    assert not out.exists() and len(list(parts_dir(out).glob("shard-*.parquet"))) == 1
    # a stray temp file of a shard that was being written when killed is ignored
    (parts_dir(out) / ".shard-000001.parquet.tmp-1").write_bytes(b"garbage")
    resumed = generate(prompts, out, str(tiny_paths["lm"]), **kw)
    assert len(list(parts_dir(out).glob("shard-*.parquet"))) == 3
    assert resumed.height == 15
    assert resumed.select("prompt_id", "candidate_index").is_duplicated().sum() == 0
    assert resumed.equals(full)  # per-prompt seeds: same as the uninterrupted run
    again = generate(prompts, out, str(tiny_paths["lm"]), **kw)  # nothing left to do
    assert again.equals(full) and len(list(parts_dir(out).glob("shard-*.parquet"))) == 3
    with pytest.raises(MrtInputError, match="other settings"):
        generate(prompts, out, str(tiny_paths["lm"]), **{**kw, "n": 4})


@pytest.mark.parametrize("ids", [[10, 2, 33], [1.5, -0.25, 7.0], ["a", "b", "c"]])
def test_generation_keeps_prompt_ids_as_given(tiny_paths, tmp_path, ids):
    """Ids come back with their value and type: they join back to the prompt table, and the
    random picks of `select` (keyed by value and type) are those of the prompt table's ids."""
    from mrt_fast.llm.generate import generate
    from mrt_fast.llm.testing import tiny_prompt_table

    prompts = tiny_prompt_table(3, with_reference=False).with_columns(pl.Series("prompt_id", ids))
    got = generate(prompts, tmp_path / "g.parquet", str(tiny_paths["lm"]), n=2, max_new_tokens=3, progress=False)
    assert got["prompt_id"].dtype == prompts["prompt_id"].dtype
    assert got["prompt_id"].unique(maintain_order=True).to_list() == ids
    assert got.join(prompts.select("prompt_id"), on="prompt_id").height == got.height
    assert pl.read_parquet(tmp_path / "g.parquet")["prompt_id"].dtype == prompts["prompt_id"].dtype


def test_generation_rejects_bad_input(tiny_paths, tmp_path):
    from mrt_fast.llm.generate import generate

    with pytest.raises(MrtInputError, match="unique"):
        generate(pl.DataFrame({"prompt_id": ["a", "a"], "prompt": ["x", "y"]}), tmp_path / "o.parquet",
                 str(tiny_paths["lm"]), n=1, progress=False)
    with pytest.raises(MrtInputError, match="prompt"):
        generate(pl.DataFrame({"prompt_id": ["a"]}), tmp_path / "o.parquet", str(tiny_paths["lm"]), n=1)
    with pytest.raises(MrtInputError, match="n must be"):
        generate(pl.DataFrame({"prompt_id": ["a"], "prompt": ["x"]}), tmp_path / "o.parquet", str(tiny_paths["lm"]), n=0)


@pytest.mark.gpu
def test_vllm_generation(tmp_path, tiny_paths):
    pytest.importorskip("vllm")
    from mrt_fast.llm.generate import generate
    from mrt_fast.llm.testing import tiny_prompt_table

    df = generate(tiny_prompt_table(2, with_reference=False), tmp_path / "v.parquet", str(tiny_paths["lm"]),
                  n=4, max_new_tokens=8, backend="vllm", progress=False,
                  vllm_kwargs={"gpu_memory_utilization": 0.2, "enforce_eager": True})
    assert df.height == 8 and (df["n_tokens"] >= 1).all() and df["logprob"].is_finite().all()


# ------------------------------------------------------------------ scoring and evaluation


def test_reward_scores_do_not_depend_on_batching(tok):
    from mrt_fast.llm.reward import RewardModel
    from mrt_fast.llm.testing import tiny_reward_model

    rm = tiny_reward_model(tok)
    ps, rs = ["a", "bb cc", "x", "The quick"], ["hello", "x", "a much longer response here", " fox"]
    together = RewardModel(rm, tok, batch_size=4)(ps, rs)
    alone = np.array([RewardModel(rm, tok, batch_size=1)([p], [r])[0] for p, r in zip(ps, rs)])
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-6)
    assert np.unique(np.round(together, 6)).size == 4


def test_coverage_and_diversity_by_hand():
    from mrt_fast.llm.evaluate import coverage_of, diversity_of

    s = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    ref = np.array([[1.0, 0.0], [-1.0, 0.0]])
    # ref 0 max cos = 1 ; ref 1 max cos = 0 (with [0,1])
    assert coverage_of(ref, s) == pytest.approx(0.5)
    c = 1 / math.sqrt(2)
    assert diversity_of(s) == pytest.approx(1 - (0 + c + c) / 3)
    with pytest.raises(MrtInputError):
        diversity_of(s[:1])
    with pytest.raises(MrtInputError):
        coverage_of(ref, np.zeros((2, 2)))


def test_reference_loss_is_token_weighted(tok):
    from mrt_fast.llm.evaluate import reference_loss
    from mrt_fast.llm.testing import tiny_causal_lm

    model = tiny_causal_lm(tok)
    ps, rs = ["The quick", "Paris is"], [" fox", " the capital of France and Rome of Italy"]
    both = reference_loss(model, tok, ps, rs, batch_size=1, prompt_format="plain")
    batched = reference_loss(model, tok, ps, rs, batch_size=2, prompt_format="plain")
    a = reference_loss(model, tok, ps[:1], rs[:1], prompt_format="plain")
    b = reference_loss(model, tok, ps[1:], rs[1:], prompt_format="plain")
    want = (a["ref_loss"] * a["ref_tokens"] + b["ref_loss"] * b["ref_tokens"]) / (a["ref_tokens"] + b["ref_tokens"])
    assert both["ref_loss"] == pytest.approx(want, rel=1e-6)
    assert batched["ref_loss"] == pytest.approx(want, rel=1e-5)
    assert abs(want - (a["ref_loss"] + b["ref_loss"]) / 2) > 1e-4  # differs from a mean of means


def test_evaluate_all_metrics(tok, tmp_path, monkeypatch):
    from mrt_fast.llm.evaluate import evaluate
    from mrt_fast.llm.reward import RewardModel
    from mrt_fast.llm.testing import HashingEmbedder, tiny_causal_lm, tiny_prompt_table, tiny_reward_model

    from mrt_fast.errors import SandboxUnavailableError
    from mrt_fast.sandbox import run as sandbox
    from mrt_fast.sandbox.run import bwrap_problem

    df = tiny_prompt_table(2).with_columns(
        pl.lit(json.dumps([{"input": "1 2\n", "output": "3\n"}])).alias("tests"))
    with monkeypatch.context() as mp:  # without isolation: refused before any model work (no model here)
        mp.setattr(sandbox, "_bwrap_exe", lambda: None)
        mp.delenv(sandbox.ENV_ISOLATION, raising=False)
        with pytest.raises(SandboxUnavailableError, match="bubblewrap"):
            evaluate(df, object(), tokenizer=tok, embedder=HashingEmbedder(), n_samples=4, progress=False)
    if bwrap_problem() is not None:
        pytest.skip(f"bubblewrap cannot isolate programs here: {bwrap_problem()}")
    m = evaluate(df, tiny_causal_lm(tok), tokenizer=tok, embedder=HashingEmbedder(),
                 reward_model=RewardModel(tiny_reward_model(tok), tok), n_samples=4, max_new_tokens=6,
                 pass_ks=[1, 4], samples_out=tmp_path / "s.parquet", progress=False,
                 sandbox={"timeout_s": 5, "cpu_s": 2, "memory_mb": 256})
    assert m["ref_loss"] > 0 and m["ref_tokens"] > 0
    assert -1 <= m["coverage"] <= 1 and 0 <= m["diversity"] <= 2
    assert np.isfinite(m["reward"]) and m["pass@1"] == 0.0 and "pass@4" in m
    s = pl.read_parquet(tmp_path / "s.parquet")
    assert s.height == 8 and {"reward", "passed"} <= set(s.columns)
    best = s.group_by("prompt_id").agg(pl.col("reward").max())["reward"].mean()
    assert m["reward"] == pytest.approx(best)


def test_evaluate_pass_at_k_through_the_sandbox(tok, monkeypatch):
    """pass@k from programs judged in the sandbox: one right program of four per prompt."""
    import mrt_fast.llm.generate as gen
    from mrt_fast.llm.evaluate import evaluate
    from mrt_fast.sandbox.run import bwrap_problem
    from mrt_fast.llm.testing import HashingEmbedder, tiny_causal_lm, tiny_prompt_table

    if bwrap_problem() is not None:
        pytest.skip(f"bubblewrap cannot isolate programs here: {bwrap_problem()}")
    responses = ["Here:\n```python\nprint(sum(map(int, input().split())))\n```", "print(0)",
                 "print(3)\nraise SystemExit(1)", "while True:\n    pass"]

    class FixedSampler:
        def __init__(self, net, tok, cfg):
            self.n = cfg.n

        def __call__(self, pid, prompt):
            return [{"response": r} for r in responses[: self.n]]

    monkeypatch.setattr(gen, "_TransformersSampler", FixedSampler)
    df = tiny_prompt_table(2).with_columns(
        pl.lit(json.dumps([{"input": "1 2\n", "output": "3\n"}, {"input": "5 5", "output": "10"}])).alias("tests"))
    m = evaluate(df, tiny_causal_lm(tok), tokenizer=tok, embedder=HashingEmbedder(), n_samples=4,
                 pass_ks=[1, 2, 4], progress=False, sandbox={"timeout_s": 5, "cpu_s": 1, "memory_mb": 256})
    assert [m["pass@1"], m["pass@2"], m["pass@4"]] == pytest.approx([0.25, 0.5, 1.0], abs=1e-12)


# ------------------------------------------------------------------ the runner


def test_runner_end_to_end(tiny_paths, tmp_path):
    import yaml

    from mrt_fast.llm.pipeline import run
    from mrt_fast.llm.testing import tiny_prompt_table

    tiny_prompt_table(4, with_reference=False).write_ndjson(tmp_path / "train.jsonl")
    tiny_prompt_table(2, offset=5).write_ndjson(tmp_path / "eval.jsonl")
    cfg = {"out_dir": str(tmp_path / "out"), "model": str(tiny_paths["lm"]), "reward_model": str(tiny_paths["reward"]),
           "embedder": "hashing", "data": {"train_prompts": str(tmp_path / "train.jsonl"),
                                            "eval": str(tmp_path / "eval.jsonl")},
           "generate": {"n": 6, "max_new_tokens": 6}, "select": {"methods": ["random", "grades"], "ks": [1, 2]},
           "train": {"max_steps": 2, "grad_accum": 2}, "evaluate": {"n_samples": 3, "max_new_tokens": 6},
           "threads": 1}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    res = run(tmp_path / "run.yaml", progress=False)
    assert res.columns[:6] == ["method", "K", "ref_loss", "reward", "coverage", "diversity"]
    assert res.select("method", "K").rows() == [("base", 0), ("random", 1), ("random", 2), ("grades", 1),
                                                 ("grades", 2)]
    assert res["ref_loss"].is_finite().all()
    out = tmp_path / "out"
    for f in ["results.csv", "results.md", "results.png", "candidates.parquet", "scored.parquet"]:
        assert (out / f).exists()
    kept = pl.read_parquet(out / "select" / "grades_k2.parquet")
    assert kept.group_by("prompt_id").len()["len"].to_list() == [2] * 4
    logs = [json.loads(x) for x in (out / "runs" / "random_k2" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logs] == [1, 2]
    # stages are reused: a second run trains and generates nothing, and returns the same table
    stamp = (out / "runs" / "random_k1" / "adapter" / "adapter_model.safetensors").stat().st_mtime_ns
    res2 = run(cfg, progress=False)
    assert res["cell"].to_list() == ["new"] * 5 and res2["cell"].to_list() == ["reused"] * 5
    assert res2.drop("cell").equals(res.drop("cell"))
    assert (out / "runs" / "random_k1" / "adapter" / "adapter_model.safetensors").stat().st_mtime_ns == stamp
    assert "| random | 1 |" in (out / "results.md").read_text()


def test_runner_config_errors(tmp_path):
    from mrt_fast.llm.pipeline import RunConfig, run

    with pytest.raises(MrtInputError, match="unknown config"):
        RunConfig.from_dict({"out_dir": "x", "model": "m", "data": {"train_prompts": "a", "eval": "b"}, "oops": 1})
    with pytest.raises(MrtInputError, match="data needs"):
        RunConfig.from_dict({"out_dir": "x", "model": "m", "data": {"train_prompts": "a"}})
    with pytest.raises(MrtInputError, match="unknown selection method"):
        run({"out_dir": str(tmp_path), "model": "m", "data": {"train_prompts": "a", "eval": "b"},
             "select": {"methods": ["best"], "ks": [1]}}, progress=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=40), st.booleans())
def test_pair_weights_match_a_reference(ids, as_text):
    from mrt_fast.llm.train import pair_weights

    pids = [f"q{i}" for i in ids] if as_text else ids
    keys, inv, counts = np.unique(np.array([str(p) for p in pids]), return_inverse=True, return_counts=True)
    want = len(pids) / (len(keys) * counts[inv])
    np.testing.assert_allclose(pair_weights(pids), want, rtol=1e-12)
    np.testing.assert_allclose(pair_weights(pl.Series(pids)), want, rtol=1e-12)
    wt = np.linspace(0.5, 2.0, len(pids))
    np.testing.assert_allclose(pair_weights(pids, weight=wt), want * wt, rtol=1e-12)
    np.testing.assert_allclose(pair_weights(pids, per_prompt=False, weight=wt), wt, rtol=1e-12)
    with pytest.raises(MrtInputError, match="weight"):
        pair_weights(pids, weight=-wt)


@pytest.mark.parametrize("fault", ["eval_missing", "prompts_lack_a_column", "validation_missing"])
def test_run_checks_every_input_before_any_model_loads(tmp_path, fault):
    """A wrong data path or a table without its columns fails first, in one line, before the
    model (here one that does not exist) is loaded or anything is written."""
    from mrt_fast.llm.pipeline import run

    prompts = tmp_path / "prompts.jsonl"
    pl.DataFrame({"prompt_id": [1, 2], "prompt": ["a", "b"]}).write_ndjson(prompts)
    evals = tmp_path / "eval.jsonl"
    pl.DataFrame({"prompt_id": [1], "prompt": ["a"], "reference": ["x"]}).write_ndjson(evals)
    data = {"train_prompts": str(prompts), "eval": str(evals)}
    cfg = {"out_dir": str(tmp_path / "run"), "model": str(tmp_path / "no-such-model"), "data": data}
    if fault == "eval_missing":
        data["eval"], want = str(tmp_path / "missing.jsonl"), "missing.jsonl"
    elif fault == "prompts_lack_a_column":
        pl.DataFrame({"prompt_id": [1], "question": ["a"]}).write_ndjson(prompts)
        want = r"train prompts .* no column\(s\) \['prompt'\]"
    else:
        data["validation"], want = str(tmp_path / "val.parquet"), "val.parquet"
    with pytest.raises(MrtInputError, match=want):
        run(cfg, progress=False)
    assert not (tmp_path / "run").exists()
