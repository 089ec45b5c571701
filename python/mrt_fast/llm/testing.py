"""Tiny, offline stand-ins for tests and CPU smoke runs.

Nothing here downloads anything: the tokenizer is a byte-level BPE trained in
code on a few sentences, the models are randomly initialised Llama blocks
(hidden 32, 2 layers, 2 heads), and the embedder hashes character trigrams.
"""

from __future__ import annotations

from pathlib import Path

from mrt_fast.embeddings.embedders import HashingEmbedder  # noqa: F401  (re-exported for tests)

#: a few sentences the tiny tokenizer is trained on (and tiny data sets draw from)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A journey of a thousand miles begins with a single step.",
    "Write a short poem about the sea and the moon.",
    "Name a colour: red, green, blue, yellow, purple or orange.",
    "def add(a, b):\n    return a + b\n",
    "print(sum(int(x) for x in input().split()))",
    "Question: what is two plus two? Answer: four.",
    "Tell me a fact about cats. Cats sleep a lot during the day.",
    "The weather today is sunny with a light breeze.",
    "Paris is the capital of France; Rome is the capital of Italy.",
]

SPECIAL = {"pad_token": "<pad>", "eos_token": "</s>", "bos_token": "<s>", "unk_token": "<unk>"}


def tiny_tokenizer(corpus: list[str] | None = None, vocab_size: int = 384):
    """A byte-level BPE tokenizer trained on `corpus`, wrapped as a fast HF tokenizer with pad/eos."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=SPECIAL["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[SPECIAL["pad_token"], SPECIAL["eos_token"], SPECIAL["bos_token"], SPECIAL["unk_token"]],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus or CORPUS) * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL)
    fast.padding_side = "right"
    return fast


def _llama_config(tokenizer, **overrides):
    from transformers import LlamaConfig

    kw = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=False,
    )
    kw.update(overrides)
    return LlamaConfig(**kw)


def tiny_causal_lm(tokenizer, seed: int = 0, **overrides):
    """A randomly initialised 2-layer Llama causal LM sized for `tokenizer`."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(_llama_config(tokenizer, **overrides))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()


def tiny_reward_model(tokenizer, seed: int = 1, **overrides):
    """A randomly initialised 2-layer Llama sequence classifier with one output (a reward)."""
    import torch
    from transformers import LlamaForSequenceClassification

    torch.manual_seed(seed)
    return LlamaForSequenceClassification(_llama_config(tokenizer, num_labels=1, **overrides)).eval()


def save_tiny_models(directory: str | Path, seed: int = 0) -> dict[str, Path]:
    """Write a tiny LM and a tiny reward model (each with its tokenizer) under `directory`.

    Returns ``{"lm": path, "reward": path}``; both load with ``from_pretrained``.
    """
    directory = Path(directory)
    tok = tiny_tokenizer()
    paths = {"lm": directory / "tiny-lm", "reward": directory / "tiny-rm"}
    for key, model in (("lm", tiny_causal_lm(tok, seed)), ("reward", tiny_reward_model(tok, seed + 1))):
        model.save_pretrained(paths[key])
        tok.save_pretrained(paths[key])
    return paths


def tiny_prompt_table(n_prompts: int = 4, with_reference: bool = True, offset: int = 0):
    """A polars table of `n_prompts` prompts (prompt_id, prompt[, reference]) drawn from CORPUS."""
    import polars as pl

    rows = []
    for i in range(n_prompts):
        s = CORPUS[(i + offset) % len(CORPUS)]
        cut = max(1, len(s) // 2)
        row = {"prompt_id": f"p{i + offset}", "prompt": s[:cut]}
        if with_reference:
            row["reference"] = s[cut:]
        rows.append(row)
    return pl.DataFrame(rows)
