"""Preference data: the pairing rules, the KTO label rules, listwise rows, pairs from the pool, and
what an export leaves out."""

from __future__ import annotations

import hashlib
import json
import math
import warnings

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from mrt_fast import MrtInputError
from mrt_fast.cli import app
from mrt_fast.llm.export import export
from mrt_fast.llm.pairs import RULES

POOLS = pl.DataFrame({"prompt_id": ["a"] * 6 + ["b"] * 3 + ["c"],
                      "prompt": ["pa"] * 6 + ["pb"] * 3 + ["pc"],
                      "response": ["a0", "a1", "a2", "a3", "a4", "a5", "b0", "b1", "b2", "c0"],
                      "reward": [5.0, 4.0, 3.0, 2.9, 2.8, -10.0, 1.0, 0.0, 0.5, 1.0]})


def _emb(text: str, dim: int = 4) -> list[float]:
    """An embedding that is a function of the text: copies of one text share it."""
    h = hashlib.sha256(text.encode()).digest()
    return [h[i] / 255.0 - 0.5 for i in range(dim)]


def _rows(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


# ---- defects: each test fails on the export that compared to the mean exactly, dropped null ids,
# wrote NaN as null, paired a text with itself, wrote plain DPO rows by default and said nothing of
# the prompts it dropped


def test_kto_pool_mean_labels_no_pool_of_equal_rewards_and_no_tie_with_the_mean(tmp_path):
    df = pl.DataFrame({"prompt_id": ["a"] * 3 + ["b"] * 3, "prompt": ["p"] * 6, "response": list("xyzuvw"),
                       "reward": [0.1, 0.1, 0.1, 0.1, 0.2, 0.3]})
    res, rep = export(df, tmp_path / "k.jsonl", "kto", kto_label="pool-mean", conversational=False,
                      return_report=True)
    # pool a: three equal rewards (their floating mean is not 0.1): no label at all; pool b: 0.2 is the mean
    assert res.select("completion", "label").rows() == [("w", True), ("u", False)]
    assert rep.responses_unlabelled == {"pools with equal rewards": 3, "at the pool mean": 1}


def test_a_null_prompt_id_is_refused_naming_its_row(tmp_path):
    df = POOLS.with_columns(pl.when(pl.col("response") == "b1").then(None).otherwise(pl.col("prompt_id"))
                            .alias("prompt_id"))
    for fmt in ("dpo", "kto", "listwise", "trl"):
        with pytest.raises(MrtInputError, match="column 'prompt_id' of the kept rows is null at row 7") as e:
            export(df, tmp_path / "x.jsonl", fmt)
        assert e.value.row == 7


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, None])
def test_non_finite_rewards_are_refused_naming_row_and_prompt(tmp_path, bad):
    df = POOLS.with_columns(pl.when(pl.col("response") == "b2").then(bad).otherwise(pl.col("reward"))
                            .alias("reward"))
    for fmt in ("openrlhf", "dpo", "kto", "listwise"):
        with pytest.raises(MrtInputError, match=r"column 'reward' of the kept rows is .* at row 8 \(prompt 'b'\): "
                                                "rewards must be finite numbers"):
            export(df, tmp_path / "x.jsonl", fmt)
    assert not (tmp_path / "x.jsonl").exists()


def test_copies_of_one_text_are_never_paired_with_each_other(tmp_path):
    df = pl.DataFrame({"prompt_id": ["a"] * 3, "prompt": ["p"] * 3, "response": ["x", "x", "y"],
                       "reward": [1.0, 0.0, 0.2]})
    assert export(df, tmp_path / "d.jsonl", "dpo", conversational=False).select("chosen", "rejected").rows() == [
        ("x", "y")]
    for rule in ("best-worst", "sweet-spot", "all"):
        res, rep = export(df, tmp_path / "d.jsonl", "dpo", pairs=rule, conversational=False, return_report=True)
        # x is one response with the mean of its rewards, 0.5
        assert res.select("chosen", "rejected").rows() == [("x", "y")]
        assert res["margin"].to_list() == pytest.approx([0.3]) and rep.duplicates_merged == 1
    with pytest.raises(MrtInputError, match="one response"):
        export(df.filter(pl.col("response") == "x"), tmp_path / "d.jsonl", "dpo")
    # means that differ only by rounding (0.15000000000000002 and 0.15) are equal rewards: no pair
    df = pl.DataFrame({"prompt_id": ["a"] * 4, "prompt": ["p"] * 4, "response": ["u", "u", "v", "v"],
                       "reward": [0.1, 0.2, 0.3, 0.0]})
    with pytest.raises(MrtInputError, match="all rewards equal"):
        export(df, tmp_path / "d.jsonl", "dpo")


@pytest.mark.parametrize("fmt", ["trl", "dpo", "kto", "listwise"])
def test_every_format_is_conversational_by_default_without_a_tokenizer(tmp_path, fmt):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # prompt c has one response
        export(POOLS, tmp_path / "x.jsonl", fmt)
    row = _rows(tmp_path / "x.jsonl")[0]
    assert row["prompt"] == [{"role": "user", "content": "pa"}]
    done = export(POOLS, tmp_path / "p.jsonl", fmt, conversational=False, return_report=True)
    assert isinstance(_rows(tmp_path / "p.jsonl")[0]["prompt"], str) and done[0].height


@pytest.mark.train
@pytest.mark.parametrize("fmt", ["trl", "dpo", "kto", "listwise"])
def test_every_format_follows_the_tokenizers_chat_template(tmp_path, fmt):
    pytest.importorskip("transformers")
    from mrt_fast.llm.testing import tiny_tokenizer

    plain, chat = tiny_tokenizer(), tiny_tokenizer()
    chat.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    for tok, conv in ((plain, False), (chat, True)):
        export(POOLS, tmp_path / "x.jsonl", fmt, tokenizer=tok, return_report=True)
        assert isinstance(_rows(tmp_path / "x.jsonl")[0]["prompt"], list) is conv
    plain.save_pretrained(tmp_path / "tok")
    POOLS.write_parquet(tmp_path / "kept.parquet")
    r = CliRunner().invoke(app, ["export", str(tmp_path / "kept.parquet"), str(tmp_path / "c.jsonl"), "--format", fmt,
                                 "--model", str(tmp_path / "tok")])
    assert r.exit_code == 0, r.output
    assert isinstance(_rows(tmp_path / "c.jsonl")[0]["prompt"], str)


def test_dpo_reports_the_prompts_it_drops_and_why(tmp_path):
    df = pl.concat([POOLS, pl.DataFrame({"prompt_id": ["d", "d"], "prompt": ["pd"] * 2, "response": ["d0", "d1"],
                                         "reward": [2.0, 2.0]})])
    df.write_parquet(tmp_path / "kept.parquet")
    r = CliRunner().invoke(app, ["export", str(tmp_path / "kept.parquet"), str(tmp_path / "c.jsonl"), "--format",
                                 "dpo", "--pairs", "best-worst", "--min-margin", "1.1"])
    assert r.exit_code == 0, r.output
    for line in ("wrote 2 dpo rows", "1 prompt dropped: one response", "1 prompt dropped: all rewards equal",
                 "pairs per prompt min/median/max: 2 / 2 / 2", "reward margin min/median/max: 1.2 / 8.1 / 15"):
        assert line in r.output
    res, rep = export(df, tmp_path / "d.jsonl", "dpo", pairs="best-worst", min_margin=1.1, return_report=True)
    assert res["prompt_id"].to_list() == ["a", "a"]  # b's largest gap is 1.0
    assert rep.prompts_dropped == {"one response (nothing to pair)": 1, "all rewards equal (no preference)": 1,
                                   "no pair with a reward margin >= 1.1 under best-worst": 1}
    assert rep.pairs_per_prompt == (2, 2, 2) and rep.margins == pytest.approx((1.2, 8.1, 15.0))
    with pytest.warns(UserWarning, match="one response .* all rewards equal .* no pair with a reward margin"):
        export(df, tmp_path / "d.jsonl", "dpo", pairs="best-worst", min_margin=1.1)


# ---- the rules, by example


def test_sweet_spot_rejects_the_response_nearest_mu_minus_two_sigma(tmp_path):
    r = np.array([5.0, 4.0, 3.0, 2.9, 2.8, -10.0])
    target = r.mean() - 2 * r.std()  # population sigma: -7.63...
    res = export(POOLS, tmp_path / "s.jsonl", "dpo", conversational=False)
    assert res.select("prompt_id", "chosen", "rejected").rows() == [("a", "a0", "a5"), ("b", "b0", "b1")]
    # a far outlier widens sigma: mu - 2 sigma (-48.3) is nearer -3 than the worst response, -100
    r2 = np.concatenate([np.linspace(0.0, 1.7, 18), [-3.0, -100.0]])
    df = pl.DataFrame({"prompt_id": ["a"] * 20, "prompt": ["pa"] * 20, "response": [f"r{i:02d}" for i in range(20)],
                       "reward": r2})
    t2 = r2.mean() - 2 * r2.std()
    assert abs(-3.0 - t2) < abs(-100.0 - t2) and target < -7
    assert export(df, tmp_path / "s.jsonl", "dpo", conversational=False)["rejected"].to_list() == ["r18"]
    bw = export(df, tmp_path / "s.jsonl", "dpo", pairs="best-worst", max_pairs=1, conversational=False)
    assert bw["rejected"].to_list() == ["r19"]


def test_margin_and_diverse_need_an_embedding_column(tmp_path):
    for rule in ("margin", "diverse"):
        with pytest.raises(MrtInputError, match=f"the '{rule}' pairing rule compares responses by their embeddings: "
                                                "the kept rows have no 'embedding' column"):
            export(POOLS, tmp_path / "x.jsonl", "dpo", pairs=rule)
    r = CliRunner().invoke(app, ["export", "in.parquet", "x.jsonl", "--format", "dpo", "--pairs", "nearest"])
    assert r.exit_code == 2 and "pairs must be one of" in r.output


def test_margin_prefers_a_close_pair_and_diverse_an_unusual_good_one(tmp_path):
    e = {"x": [1.0, 0.0], "x2": [0.99, 0.14], "y": [0.0, 1.0], "z": [0.7, 0.7], "w": [0.9, 0.44]}
    df = pl.DataFrame({"prompt_id": ["a"] * 5, "prompt": ["p"] * 5, "response": ["x", "y", "z", "x2", "w"],
                       "reward": [1.0, 0.9, 0.0, 0.2, 0.1]}).with_columns(
        pl.col("response").replace_strict(e, return_dtype=pl.List(pl.Float64)).alias("embedding"))
    m = export(df, tmp_path / "m.jsonl", "dpo", pairs="margin", conversational=False)
    assert m.select("chosen", "rejected").rows() == [("x", "x2")]  # margin 0.8 at cosine distance 0.01
    # q = ceil(5 / 4) = 2: of x and y, y is the least like the others; of z and w, w is the most like them
    d = export(df, tmp_path / "d.jsonl", "dpo", pairs="diverse", conversational=False)
    assert d.select("chosen", "rejected").rows() == [("y", "w")]


def test_all_pairs_largest_margins_first_under_the_cap(tmp_path):
    res = export(POOLS.filter(pl.col("prompt_id") == "b"), tmp_path / "a.jsonl", "dpo", pairs="all",
                 conversational=False)
    assert res.select("chosen", "rejected").rows() == [("b0", "b1"), ("b0", "b2"), ("b2", "b1")]
    capped = export(POOLS, tmp_path / "a.jsonl", "dpo", pairs="all", max_pairs=2, min_margin=1.0,
                    conversational=False)
    assert capped.select("chosen", "rejected").rows() == [("a0", "a5"), ("a1", "a5"), ("b0", "b1")]


def test_kto_absolute_labels(tmp_path):
    df = POOLS.with_columns((pl.col("reward") > 2).alias("correct"))
    res, rep = export(df, tmp_path / "k.jsonl", "kto", kto_label="threshold:1", conversational=False,
                      return_report=True)
    assert dict(res.select("completion", "label").rows()) == {
        "a0": True, "a1": True, "a2": True, "a3": True, "a4": True, "a5": False, "b1": False, "b2": False}
    assert rep.responses_unlabelled == {"at the threshold 1": 2} and rep.labels == {"desirable": 5, "undesirable": 3}
    q = export(df, tmp_path / "k.jsonl", "kto", kto_label="quantile:0.5", conversational=False)  # median 1.9
    assert q.filter(pl.col("label"))["completion"].to_list() == ["a0", "a1", "a2", "a3", "a4"]
    c = export(df.drop("reward"), tmp_path / "k.jsonl", "kto", kto_label="column:correct", conversational=False)
    assert c["label"].sum() == 5 and c.height == 10
    for spec, msg in (("column:ok", "no 'ok' column"), ("quantile:2", "kto_label must be"),
                      ("mean", "kto_label must be"), ("column:prompt", "must be boolean")):
        with pytest.raises(MrtInputError, match=msg):
            export(df, tmp_path / "k.jsonl", "kto", kto_label=spec)


def test_listwise_rows_rank_the_responses(tmp_path):
    res, rep = export(POOLS, tmp_path / "l.jsonl", "listwise", conversational=False, return_report=True)
    rows = _rows(tmp_path / "l.jsonl")
    assert [r["completions"] for r in rows] == [["a0", "a1", "a2", "a3", "a4", "a5"], ["b0", "b2", "b1"]]
    assert rows[1]["rewards"] == [1.0, 0.5, 0.0] and rep.prompts_dropped["one response (nothing to rank)"] == 1


def test_pairs_from_the_pool_or_the_kept_rows(tmp_path):
    kept = POOLS.filter(pl.col("response").is_in(["a0", "a1", "a2", "b0", "b2"]))
    small = export(kept, tmp_path / "k.jsonl", "dpo", conversational=False)
    big, rep = export(kept, tmp_path / "p.jsonl", "dpo", pool=POOLS, pairs_from="pool", conversational=False,
                      return_report=True)
    assert small["margin"].to_list() == [2.0, 0.5] and big["margin"].to_list() == [15.0, 1.0]
    assert rep.source == "pool" and rep.rows_in == 9 and rep.prompts_in == 2  # prompt c was not kept
    with pytest.raises(MrtInputError, match="pairs from the pool need the candidate table"):
        export(kept, tmp_path / "p.jsonl", "dpo", pairs_from="pool")
    with pytest.raises(MrtInputError, match="the pool is read only for pairs from the pool"):
        export(kept, tmp_path / "p.jsonl", "dpo", pool=POOLS, pairs_from="kept")
    assert export(kept, tmp_path / "p.jsonl", "dpo", pool=POOLS, conversational=False).equals(big)
    with pytest.raises(MrtInputError, match="1 prompts of the kept rows are not in the pool, e.g. 'b'"):
        export(kept, tmp_path / "p.jsonl", "dpo", pool=POOLS.filter(pl.col("prompt_id") != "b"), pairs_from="pool")
    kept.write_parquet(tmp_path / "kept.parquet")
    POOLS.write_parquet(tmp_path / "pool.parquet")
    r = CliRunner().invoke(app, ["export", str(tmp_path / "kept.parquet"), str(tmp_path / "c.jsonl"), "--format",
                                 "dpo", "--pool", str(tmp_path / "pool.parquet")])
    assert r.exit_code == 0, r.output
    assert "from 9 pool rows of 2 prompts" in r.output and "15" in r.output


@pytest.mark.parametrize("fmt", ["dpo", "kto", "listwise"])
def test_bad_preference_input_gets_one_line(tmp_path, fmt):
    cases = {"no reward": POOLS.drop("reward"),
             "nan": POOLS.with_columns(pl.lit(math.nan).alias("reward")),
             "one response": POOLS.filter(pl.col("prompt_id") == "c"),
             "equal": POOLS.with_columns(pl.lit(1.0).alias("reward"))}
    want = {"no reward": "have no 'reward' column", "nan": "is NaN at row 0 (prompt 'a')",
            "one response": "one response", "equal": "equal"}
    for name, df in cases.items():
        if fmt == "kto" and name in ("one response", "equal"):
            df = df.with_columns(pl.lit(1.0).alias("reward"))
            args = {"kto_label": "threshold:1"}  # every reward at the threshold: nothing labelled
            msg = "at the threshold 1"
        else:
            args, msg = {}, want[name]
        df.write_parquet(tmp_path / "in.parquet")
        r = CliRunner().invoke(app, ["export", str(tmp_path / "in.parquet"), str(tmp_path / "o.jsonl"), "--format",
                                     fmt, *[f"--{k.replace('_', '-')}={v}" for k, v in args.items()]])
        assert r.exit_code == 2, (name, r.output)
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and msg in r.output.replace("\n", ""), (name, lines)


# ---- the promises of every rule, on random pools


@st.composite
def pools(draw):
    n = draw(st.integers(1, 40))
    pid = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    text = draw(st.lists(st.sampled_from(["u", "v", "w", "x", "y", "z", "uu", "vv"]), min_size=n, max_size=n))
    reward = draw(st.lists(st.sampled_from([0.0, 0.1, 0.2, 0.3, 1.0, -2.5, 1e-12]), min_size=n, max_size=n))
    df = pl.DataFrame({"prompt_id": pid, "prompt": [f"p{i}" for i in pid], "response": text, "reward": reward})
    df = df.with_columns(pl.col("response").map_elements(_emb, return_dtype=pl.List(pl.Float64)).alias("embedding"))
    seed = draw(st.integers(0, 2**31 - 1))
    return df, seed


def _export_or_none(df, path, **kw):
    try:
        return export(df, path, return_report=True, conversational=False, **kw)[0]
    except MrtInputError as e:
        assert "no " in str(e) and "could be built" in str(e)
        return None


@settings(max_examples=60, deadline=None)
@given(pools(), st.sampled_from(RULES), st.sampled_from([0.0, 0.15, 1.0]), st.sampled_from([None, 1, 3]))
def test_every_rule_prefers_the_higher_reward_never_pairs_a_text_with_itself_and_ignores_row_order(
        tmp_path_factory, data, rule, min_margin, max_pairs):
    df, seed = data
    path = tmp_path_factory.mktemp("p") / "d.jsonl"
    kw = dict(format="dpo", pairs=rule, min_margin=min_margin, max_pairs=max_pairs)
    res = _export_or_none(df, path, **kw)
    shuffled = _export_or_none(df.sample(fraction=1.0, shuffle=True, seed=seed), path, **kw)
    if res is None:
        assert shuffled is None
        return
    mean = df.group_by("prompt_id", "response").agg(pl.col("reward").mean())
    r = {(p, t): v for p, t, v in mean.rows()}
    for p, c, w, m in res.select("prompt_id", "chosen", "rejected", "margin").rows():
        scale = df.filter(pl.col("prompt_id") == p)["reward"].abs().max()
        assert c != w
        assert r[p, c] > r[p, w] and m == pytest.approx(r[p, c] - r[p, w]) and m >= min_margin
        assert m > 1e-9 * scale
    per = res.group_by("prompt_id").len()["len"]
    assert per.max() <= (1 if rule in ("sweet-spot", "margin", "diverse") else max_pairs or 10**9)
    # the same pairs, prompt by prompt, whatever the row order
    assert res.sort("prompt_id", maintain_order=True).equals(shuffled.sort("prompt_id", maintain_order=True))


@settings(max_examples=40, deadline=None)
@given(pools(), st.sampled_from(["pool-mean", "threshold:0.2", "quantile:0.3"]))
def test_kto_labels_follow_their_rule_and_ignore_row_order(tmp_path_factory, data, rule):
    df, seed = data
    path = tmp_path_factory.mktemp("k") / "k.jsonl"
    res = _export_or_none(df, path, format="kto", kto_label=rule)
    shuffled = _export_or_none(df.sample(fraction=1.0, shuffle=True, seed=seed), path, format="kto", kto_label=rule)
    if res is None:
        assert shuffled is None
        return
    assert res.sort("prompt_id", maintain_order=True).equals(shuffled.sort("prompt_id", maintain_order=True))
    mean = {(p, t): v for p, t, v in df.group_by("prompt_id", "response").agg(pl.col("reward").mean()).rows()}
    for p, t, label in res.select("prompt_id", "completion", "label").rows():
        v = mean[p, t]
        if rule == "pool-mean":
            pool = df.filter(pl.col("prompt_id") == p)["reward"]
            width = 1e-9 * pool.abs().max()
            assert pool.max() - pool.min() > width and (v > pool.mean()) is label and abs(v - pool.mean()) > width
        else:
            x = 0.2 if rule.startswith("threshold") else float(np.quantile(df["reward"].to_numpy(), 0.3))
            assert abs(v - x) > 1e-9 * max(abs(v), abs(x)) and (v > x) is label


@settings(max_examples=30, deadline=None)
@given(pools())
def test_listwise_ranks_best_first_and_ignores_row_order(tmp_path_factory, data):
    df, seed = data
    path = tmp_path_factory.mktemp("l") / "l.jsonl"
    res = _export_or_none(df, path, format="listwise")
    shuffled = _export_or_none(df.sample(fraction=1.0, shuffle=True, seed=seed), path, format="listwise")
    if res is None:
        assert shuffled is None
        return
    assert res.sort("prompt_id").equals(shuffled.sort("prompt_id"))
    for texts, rewards in res.select("completions", "rewards").rows():
        assert len(set(texts)) == len(texts) >= 2 and rewards == sorted(rewards, reverse=True)


# ---- odd data: what the export may not write quietly


@st.composite
def odd_pools(draw):
    """Pools with what an export meets at the edges: rewards equal within a pool (0.1 three times, whose
    floating mean is not 0.1), NaN, inf and null rewards, null prompt ids, copies of one text with
    different rewards."""
    n = draw(st.integers(1, 24))
    pid = draw(st.lists(st.sampled_from(["a", "b", "c", None]) if draw(st.booleans()) else st.sampled_from("abc"),
                        min_size=n, max_size=n))
    finite = st.sampled_from([0.1, 0.1, 0.2, 0.3, -1.0, 1e-300])
    odd = st.sampled_from([math.nan, math.inf, -math.inf, None])
    reward = draw(st.lists(finite | odd if draw(st.booleans()) else finite, min_size=n, max_size=n))
    text = draw(st.lists(st.sampled_from(["x", "y", "z", "w"]), min_size=n, max_size=n))
    return pl.DataFrame({"prompt_id": pid, "prompt": [f"p{p}" for p in pid], "response": text, "reward": reward},
                        schema_overrides={"reward": pl.Float64, "prompt_id": pl.String})


@settings(max_examples=80, deadline=None)
@given(odd_pools(), st.sampled_from(["dpo", "kto", "openrlhf", "listwise", "trl"]), st.sampled_from(RULES),
       st.sampled_from(["pool-mean", "quantile:0.5", "threshold:0.1"]))
def test_odd_data_is_refused_in_one_line_or_exported_without_a_silent_loss(tmp_path_factory, df, fmt, rule, label):
    path = tmp_path_factory.mktemp("odd") / "x.jsonl"
    kw = dict(pairs=rule) if fmt == "dpo" else dict(kto_label=label) if fmt == "kto" else {}
    if rule in ("margin", "diverse") and fmt == "dpo":
        df = df.with_columns(pl.col("response").map_elements(_emb, return_dtype=pl.List(pl.Float64))
                             .alias("embedding"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = export(df, path, fmt, conversational=False, **kw)
    except MrtInputError as e:
        assert str(e).strip() and "\n" not in str(e).strip(), str(e)
        assert not path.exists()
        return
    null_id = df["prompt_id"].is_null().any()
    bad_reward = not df["reward"].is_finite().fill_null(False).all()
    assert not null_id, "a null prompt id was exported without a word"
    assert not (bad_reward and fmt != "trl"), "a NaN, inf or null reward was exported"
    written = _rows(path)
    assert len(written) == res.height
    for row in written:
        if fmt == "openrlhf":
            assert isinstance(row["reward"], float) and math.isfinite(row["reward"]), row
        if fmt == "dpo":
            assert row["chosen"] != row["rejected"], row
    if fmt == "kto" and label == "pool-mean":
        mean = df.group_by("prompt_id").agg(pl.col("reward").max() - pl.col("reward").min())
        flat = {p for p, spread in mean.rows() if spread <= 1e-9 * 0.3}
        assert not set(res["prompt_id"].to_list()) & flat, "a pool of equal rewards was labelled"


# ---- the files train with the trainers they are for (tiny models, offline, one step)

TRAIN = pl.DataFrame({"prompt_id": [i // 4 for i in range(16)], "prompt": [f"Say {i // 4}." for i in range(16)],
                      "response": [f"ok {i}" for i in range(16)], "reward": [float(i % 4) for i in range(16)]})


def _tiny(tmp_path, chat: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mrt_fast.llm.testing import save_tiny_models

    models = save_tiny_models(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(models["lm"])
    if chat:
        tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}</s>\n"
                             "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return AutoModelForCausalLM.from_pretrained(models["lm"]), tok


def _common(tmp_path):
    return dict(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=4, report_to=[],
                use_cpu=True, save_strategy="no", disable_tqdm=True)


@pytest.mark.train
@pytest.mark.parametrize("chat", [False, True])
def test_dpo_rows_train_one_step_of_trls_dpo_trainer(tmp_path, chat):
    trl = pytest.importorskip("trl")
    import torch
    from datasets import load_dataset

    torch.set_num_threads(1)
    model, tok = _tiny(tmp_path, chat)
    export(TRAIN, tmp_path / "d.jsonl", "dpo", pairs="all", tokenizer=tok)
    ds = load_dataset("json", data_files=str(tmp_path / "d.jsonl"), split="train")
    assert len(ds) == 24 and isinstance(ds[0]["prompt"], list) is chat
    out = trl.DPOTrainer(model=model, args=trl.DPOConfig(**_common(tmp_path)), train_dataset=ds,
                         processing_class=tok).train()
    assert out.global_step == 1 and np.isfinite(out.training_loss)


@pytest.mark.train
@pytest.mark.parametrize("chat", [False, True])
def test_kto_rows_train_one_step_of_trls_kto_trainer(tmp_path, chat):
    trl = pytest.importorskip("trl")
    import torch
    from datasets import load_dataset

    torch.set_num_threads(1)
    model, tok = _tiny(tmp_path, chat)
    export(TRAIN, tmp_path / "k.jsonl", "kto", kto_label="threshold:1.5", tokenizer=tok)
    ds = load_dataset("json", data_files=str(tmp_path / "k.jsonl"), split="train")
    assert len(ds) == 16 and sum(ds["label"]) == 8 and isinstance(ds[0]["completion"], list) is chat
    out = trl.KTOTrainer(model=model, args=trl.KTOConfig(**_common(tmp_path)), train_dataset=ds,
                         processing_class=tok).train()
    assert out.global_step == 1 and np.isfinite(out.training_loss)


@pytest.mark.train
def test_sft_listwise_and_openrlhf_rows_load_with_datasets_and_sft_trains(tmp_path):
    trl = pytest.importorskip("trl")
    import torch
    from datasets import load_dataset

    torch.set_num_threads(1)
    model, tok = _tiny(tmp_path, True)
    export(TRAIN, tmp_path / "l.jsonl", "listwise", tokenizer=tok)
    lw = load_dataset("json", data_files=str(tmp_path / "l.jsonl"), split="train")
    assert len(lw) == 4 and lw[0]["rewards"] == [3.0, 2.0, 1.0, 0.0]
    assert lw[0]["completions"][0] == [{"role": "assistant", "content": "ok 3"}]
    export(TRAIN, tmp_path / "o.jsonl", "openrlhf")
    o = load_dataset("json", data_files=str(tmp_path / "o.jsonl"), split="train")
    assert len(o) == 16 and o[0] == {"input": "Say 0.", "output": "ok 0", "reward": 0.0}
    export(TRAIN, tmp_path / "s.jsonl", "trl", tokenizer=tok)
    ds = load_dataset("json", data_files=str(tmp_path / "s.jsonl"), split="train")
    out = trl.SFTTrainer(model=model, args=trl.SFTConfig(**_common(tmp_path)), train_dataset=ds,
                         processing_class=tok).train()
    assert out.global_step == 1 and np.isfinite(out.training_loss)


def _reference(df: pl.DataFrame, rule: str, min_margin: float, max_pairs: int | None) -> list[tuple]:
    """best-worst and all, written out from their definitions (distinct texts in every pool)."""
    out = []
    for pid in sorted(set(df["prompt_id"].to_list())):
        pool = sorted(df.filter(pl.col("prompt_id") == pid).select("response", "reward").rows(),
                      key=lambda x: (-x[1], x[0]))
        scale = max(abs(r) for _, r in pool)
        ok = lambda a, b: a[1] - b[1] > 1e-9 * scale and a[1] - b[1] >= min_margin  # noqa: E731
        if rule == "best-worst":
            pairs = []
            for i in range(len(pool) // 2):
                if not ok(pool[i], pool[-1 - i]) or len(pairs) == (max_pairs or 10**9):
                    break
                pairs.append((pool[i][0], pool[-1 - i][0]))
        else:
            cand = [(pool[i][1] - pool[j][1], i, j) for i in range(len(pool)) for j in range(i + 1, len(pool))
                    if ok(pool[i], pool[j])]
            pairs = [(pool[i][0], pool[j][0]) for _, i, j in sorted(cand, key=lambda x: (-x[0], x[1], x[2]))]
            pairs = pairs[:max_pairs]
        out += [(pid, c, w) for c, w in pairs]
    return out


@settings(max_examples=60, deadline=None)
@given(pools(), st.sampled_from(["best-worst", "all"]), st.sampled_from([0.0, 0.15, 1.0]),
       st.sampled_from([None, 1, 2]))
def test_best_worst_and_all_are_their_definitions(tmp_path_factory, data, rule, min_margin, max_pairs):
    df = data[0].unique(["prompt_id", "response"], keep="first", maintain_order=True)
    res = _export_or_none(df, tmp_path_factory.mktemp("r") / "d.jsonl", format="dpo", pairs=rule,
                          min_margin=min_margin, max_pairs=max_pairs)
    got = [] if res is None else res.sort("prompt_id", maintain_order=True).select(
        "prompt_id", "chosen", "rejected").rows()
    assert got == _reference(df, rule, min_margin, max_pairs)
