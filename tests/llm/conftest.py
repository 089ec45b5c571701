"""Fixtures the LLM test modules share: one torch thread per test module that asks for the tiny
models, the tiny offline models themselves (saved once per module), and the tiny LM with a chat
template."""

import pytest


@pytest.fixture(scope="module")
def torch_one_thread():
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory, torch_one_thread):
    from mrt_fast.llm.testing import save_tiny_models

    return save_tiny_models(tmp_path_factory.mktemp("models"))


#: a minimal chat template for the tiny tokenizer
CHAT = ("{% for m in messages %}<s>user: {{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant: {% endif %}")


@pytest.fixture(scope="module")
def chat_lm(tiny_paths, tmp_path_factory):
    """The tiny LM saved with a chat template on its tokenizer."""
    from mrt_fast.llm.models import load_causal_lm, load_tokenizer

    d = tmp_path_factory.mktemp("chat") / "tiny-chat"
    tok = load_tokenizer(str(tiny_paths["lm"]))
    tok.chat_template = CHAT
    load_causal_lm(str(tiny_paths["lm"])).save_pretrained(d)
    tok.save_pretrained(d)
    return d
