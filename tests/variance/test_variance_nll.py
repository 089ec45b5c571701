"""Per-response NLL under a causal LM: batched == one at a time, prompt masked."""

from __future__ import annotations

import numpy as np
import pytest

from mrt_fast import MrtInputError

pytestmark = pytest.mark.train

TEXTS = [
    "how hot is the weather today",
    "does it feel really warm today",
    "it is sunny and warm",
    "cold and rainy with wind",
    "the answer is forty two",
    "write a haiku about the sea",
    "waves fold into foam",
]


@pytest.fixture(scope="module")
def tiny():
    import torch

    from mrt_fast.llm.testing import tiny_causal_lm, tiny_tokenizer

    torch.set_num_threads(1)
    tok = tiny_tokenizer(TEXTS)
    return tiny_causal_lm(tok, seed=0).eval(), tok


def manual_nll(model, tok, prompt, response):
    import torch

    p = tok(prompt, add_special_tokens=True)["input_ids"] or [tok.bos_token_id]
    r = tok(response, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]  # the response's EOS is scored
    ids = torch.tensor([p + r])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    logp = torch.log_softmax(logits.double(), -1)
    tgt = ids[0, len(p):]
    return float(-logp[len(p) - 1 : -1].gather(-1, tgt[:, None]).mean())


def test_batched_matches_unbatched(tiny):
    from mrt_fast.llm.nll import response_nll

    model, tok = tiny
    prompts = [TEXTS[0], TEXTS[0], TEXTS[1], TEXTS[5], "q"]
    responses = [TEXTS[2], TEXTS[3], TEXTS[2] + " " + TEXTS[4], TEXTS[6], "a"]
    got = response_nll(model, tok, prompts, responses, batch_size=3, progress=False)
    want = [manual_nll(model, tok, p, r) for p, r in zip(prompts, responses)]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    one = response_nll(model, tok, prompts, responses, batch_size=1, progress=False, sort_by_length=False)
    np.testing.assert_allclose(got, one, rtol=1e-4, atol=1e-5)
    # the prompt is masked: changing only the prompt changes the loss through context,
    # while the number of scored tokens is the response's
    assert got[0] != got[1]


def test_nll_bad_input(tiny):
    from mrt_fast.llm.nll import response_nll

    model, tok = tiny
    # an empty response is "stop at once": its loss is -log p(EOS | prompt)
    assert response_nll(model, tok, ["a"], [""], progress=False)[0] == pytest.approx(manual_nll(model, tok, "a", ""), rel=1e-4)
    with pytest.raises(MrtInputError, match="differ in length"):
        response_nll(model, tok, ["a", "b"], ["c"], progress=False)
    with pytest.raises(MrtInputError, match="max_length"):
        response_nll(model, tok, ["a"], [TEXTS[5]], max_length=1, progress=False)
    with pytest.raises(MrtInputError, match="batch_size"):
        response_nll(model, tok, ["a"], ["b"], batch_size=0, progress=False)


def test_nll_feeds_variance_budget(tiny):
    import polars as pl

    from mrt_fast import variance_budget
    from mrt_fast.llm.nll import response_nll

    model, tok = tiny
    prompts = [TEXTS[i % 3] for i in range(12)]
    responses = [TEXTS[3 + (i % 4)] for i in range(12)]
    loss = response_nll(model, tok, prompts, responses, batch_size=4, progress=False)
    rep = variance_budget(pl.DataFrame({"prompt_id": prompts, "loss": loss}), n_boot=20)
    assert rep.n_prompts == 3 and rep.v_y_given_x > 0


@pytest.mark.slow
def test_smollm2_gguf_two_examples():
    pytest.importorskip("gguf")
    from mrt_fast.llm.nll import load_smollm2, response_nll

    try:
        model, tok = load_smollm2()
    except (ImportError, FileNotFoundError) as e:
        pytest.skip(str(e))
    loss = response_nll(
        model, tok, ["The capital of France is", "The capital of France is"], [" Paris.", " a banana made of glue."], progress=False
    )
    assert np.isfinite(loss).all() and loss[0] < loss[1]
