"""Shared plumbing of the LLM pipeline: loading models and formatting prompts."""

from __future__ import annotations

import contextlib

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from mrt_fast.errors import MissingDependencyError, MrtInputError

PROMPT_FORMATS = ("auto", "chat", "plain")


def stable_seed(seed: int, key: Any) -> int:
    """A 63-bit seed from (global seed, key): independent of row order, sharding and restarts."""
    h = hashlib.blake2b(f"{int(seed)}\x00{key!r}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


def resolve_dtype(dtype: str | None, device: str):
    import torch

    if dtype in (None, "auto"):
        return torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
    try:
        return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                "float16": torch.float16, "fp16": torch.float16}[dtype]
    except KeyError:
        raise MrtInputError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16") from None


def resolve_model_path(spec: str) -> str:
    """``pkg://package/relative/path`` -> that file inside an installed package; other specs unchanged."""
    spec = str(spec)
    if spec.startswith("pkg://"):
        import importlib.util

        pkg, _, rest = spec[len("pkg://") :].partition("/")
        found = importlib.util.find_spec(pkg)
        if found is None or not found.submodule_search_locations:
            raise MissingDependencyError(f"model {spec!r}: package {pkg!r} is not installed")
        p = Path(list(found.submodule_search_locations)[0]) / rest
        if not p.exists():
            raise MrtInputError(f"model {spec!r}: {rest!r} not found in package {pkg!r}")
        return str(p)
    return spec


def _gguf_location(spec: str) -> tuple[str, str | None]:
    """(directory or hub id, gguf file name or None) for a model spec."""
    spec = resolve_model_path(spec)
    p = Path(spec)
    if p.is_file() and p.suffix == ".gguf":
        return str(p.parent), p.name
    if p.is_dir() and not (p / "config.json").exists():
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return str(p), ggufs[0].name
        if len(ggufs) > 1:
            raise MrtInputError(f"{p} holds several .gguf files {[g.name for g in ggufs]}: name one")
    return spec, None


def is_gguf(spec: Any) -> bool:
    return isinstance(spec, (str, os.PathLike)) and _gguf_location(str(spec))[1] is not None


def materialize_gguf(spec: str, dest: str | os.PathLike) -> str:
    """Dequantise a GGUF model once into a regular checkpoint directory (reused when present).

    Loading a GGUF dequantises every tensor, which takes minutes on a CPU; a
    pipeline loads the base model once per stage and cell, so it loads this copy.
    """
    dest = Path(dest)
    if (dest / "config.json").exists():
        return str(dest)
    model = load_causal_lm(spec, device="cpu", dtype="float32")
    tok = load_tokenizer(spec)
    tmp = dest.with_name(dest.name + f".tmp-{os.getpid()}")
    # the tensors are plain float32 after loading; drop the GGUF marker so the copy saves as a regular checkpoint
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for attr in ("is_quantized", "quantization_method"):
        if attr in model.__dict__:
            del model.__dict__[attr]
    # the model's own special ids follow the tokenizer's (which are the GGUF file's, see load_tokenizer)
    for attr in ("eos_token_id", "bos_token_id", "pad_token_id"):
        tid = getattr(tok, attr, None)
        if tid is not None:
            setattr(model.config, attr, tid)
            if getattr(model, "generation_config", None) is not None:
                setattr(model.generation_config, attr, tid)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, dest)
    return str(dest)


@contextlib.contextmanager
def _loading(what: str, spec: Any):
    """A model or tokenizer that transformers cannot load (a folder without a usable config, missing
    or damaged weights, an unknown hub id) is one line naming it, not a traceback."""
    try:
        yield
    except (OSError, ValueError, KeyError) as e:
        from mrt_fast._util.messages import one_line

        raise MrtInputError(f"cannot load the {what} from {str(spec)!r}: {one_line(e)}") from None


#: the GGUF metadata keys of the special tokens, by the tokenizer attribute each sets
GGUF_SPECIAL_TOKENS = {"eos_token": "tokenizer.ggml.eos_token_id", "bos_token": "tokenizer.ggml.bos_token_id",
                       "pad_token": "tokenizer.ggml.padding_token_id", "unk_token": "tokenizer.ggml.unknown_token_id"}


def gguf_special_token_ids(path: str | os.PathLike) -> dict[str, int]:
    """The special tokens' ids a GGUF file records (``eos_token`` -> id, ...), the ones it has."""
    try:
        import gguf
    except ImportError:
        raise MissingDependencyError("reading a GGUF model needs the gguf package: pip install 'mrt_fast[train]'") from None
    reader = gguf.GGUFReader(str(path))
    out = {}
    for attr, key in GGUF_SPECIAL_TOKENS.items():
        field = reader.fields.get(key)
        if field is not None and field.data:
            out[attr] = int(field.parts[field.data[0]][0])
    return out


def _gguf_special_tokens(tok, path: str | os.PathLike):
    """Set the tokenizer's special tokens to the GGUF file's own: how transformers maps them has changed between
    releases (one made SmolLM2's start-of-turn token its eos), and the eos is the token every response is trained
    to end with."""
    for attr, tid in gguf_special_token_ids(path).items():
        if 0 <= tid < len(tok) and getattr(tok, f"{attr}_id", None) != tid:
            setattr(tok, attr, tok.convert_ids_to_tokens(tid))
    return tok


def load_tokenizer(spec: Any):
    """A tokenizer from a path / hub id / .gguf file, or the object itself; pads on the right, has a pad token.

    From a .gguf file, the special tokens are the ones the file records."""
    if not isinstance(spec, (str, os.PathLike)):
        tok = spec
    else:
        from transformers import AutoTokenizer

        where, gguf = _gguf_location(str(spec))
        with _loading("tokenizer", spec):
            tok = AutoTokenizer.from_pretrained(where, **({"gguf_file": gguf} if gguf else {}))
        if gguf:
            _gguf_special_tokens(tok, Path(where) / gguf)
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise MrtInputError("the tokenizer has neither a pad nor an eos token")
        tok.pad_token = tok.eos_token
    if tok.eos_token_id is None:
        raise MrtInputError("the tokenizer has no eos token: responses could not be terminated")
    return tok


def load_causal_lm(spec: Any, *, device: str = "cpu", dtype: str | None = None, adapter: str | None = None):
    """A causal LM (eval mode) from a path / hub id / .gguf file / object, optionally with a LoRA adapter."""
    if isinstance(spec, (str, os.PathLike)):
        from transformers import AutoModelForCausalLM

        where, gguf = _gguf_location(str(spec))
        kw: dict[str, Any] = {"dtype": resolve_dtype(dtype, device)}
        if gguf:
            kw["gguf_file"] = gguf
        with _loading("model", spec):
            model = AutoModelForCausalLM.from_pretrained(where, **kw)
    else:
        model = spec
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    return model.to(device).eval()


def uses_chat_template(tokenizer, mode: str = "auto") -> bool:
    """Whether a prompt is formatted by the chat template: ``chat``, or ``auto`` and the tokenizer has one."""
    if mode not in PROMPT_FORMATS:
        raise MrtInputError(f"prompt_format must be one of {PROMPT_FORMATS}, got {mode!r}")
    return mode == "chat" or (mode == "auto" and bool(getattr(tokenizer, "chat_template", None)))


def format_prompt(tokenizer, prompt: str, mode: str = "auto") -> str:
    """The text the model sees before the response: the chat template's user turn, or the prompt itself."""
    if uses_chat_template(tokenizer, mode):
        if not getattr(tokenizer, "chat_template", None):
            raise MrtInputError("prompt_format='chat' but the tokenizer has no chat template")
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    return prompt


def prompt_ids(tokenizer, prompt: str, mode: str = "auto") -> list[int]:
    text = format_prompt(tokenizer, prompt, mode)
    chat = text is not prompt
    # a chat template writes its own special tokens; plain prompts get the tokenizer's (e.g. BOS)
    return list(tokenizer(text, add_special_tokens=not chat).input_ids)


def response_ids(tokenizer, response: str, add_eos: bool = True) -> list[int]:
    ids = list(tokenizer(response, add_special_tokens=False).input_ids)
    if add_eos:
        ids.append(tokenizer.eos_token_id)
    return ids


def set_threads(n: int | None) -> None:
    if n:
        import torch

        torch.set_num_threads(int(n))


def unit_rows(x: np.ndarray, what: str = "embeddings") -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise MrtInputError(f"{what} must be a 2-d array, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise MrtInputError(f"{what} contain NaN or inf")
    n = np.linalg.norm(x, axis=1, keepdims=True)
    if (n == 0).any():
        raise MrtInputError(f"{what} contain an all-zero vector (row {int(np.argmax(n[:, 0] == 0))})")
    return x / n
