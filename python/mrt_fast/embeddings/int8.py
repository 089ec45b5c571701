"""MiniLM quantized to int8 and run by onnxruntime, exported on first use.

The ``int8`` tier is the bundled all-MiniLM-L6-v2 itself, made cheaper on a
CPU: on first use its transformer is exported to ONNX by ``torch.onnx`` (with
a padded example, so the attention mask stays an input of the graph), its
weights are quantized to int8 per output channel by onnxruntime's
``quantize_dynamic`` (activations are quantized on the fly), and the file is
kept in the embedding cache directory. Inference tokenises with the model's
fast tokenizer (special tokens, truncation at the model's ``max_seq_length``),
sorts texts by length, pads each batch to its longest text, runs the graph on
onnxruntime's CPU provider, mean-pools the output states over the mask and
normalises: the pipeline of sentence-transformers' ``encode``, with int8
matrix products.

The file is named after the source weights' sha256 and the format version,
written atomically with a sidecar JSON that records its own sha256: a damaged
or half-written file is exported again, never trusted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from mrt_fast.errors import MissingDependencyError, MrtInputError

#: names that select the int8 tier of the bundled MiniLM
INT8_ALIASES = frozenset({"int8", "minilm-int8"})
#: ``int8:PATH`` quantizes another local sentence-transformers directory instead
INT8_PREFIX = "int8:"
#: version of the export and quantization steps (part of the file name and of the model id)
FORMAT_VERSION = 1
#: texts per onnxruntime call at most: small batches pad little and ran fastest on a 2-core CPU
MAX_BATCH = 16
OPSET = 17


def is_int8(model) -> bool:
    """Whether ``model`` names the int8 tier."""
    return model is not None and (str(model) in INT8_ALIASES or str(model).startswith(INT8_PREFIX))


def _need_onnx():
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise MissingDependencyError("the int8 tier needs onnxruntime and onnx (pip install 'mrt_fast[int8]')") from None
    return onnxruntime


def _max_tokens(src: Path) -> int:
    """The source model's ``max_seq_length`` (sentence-transformers config), capped by its positions."""
    limit = 512
    cfg = src / "config.json"
    if cfg.is_file():
        limit = int(json.loads(cfg.read_text()).get("max_position_embeddings", limit))
    sb = src / "sentence_bert_config.json"
    if sb.is_file():
        limit = min(limit, int(json.loads(sb.read_text()).get("max_seq_length", limit)))
    return limit


@dataclass
class Int8Model:
    """An onnxruntime session of the quantized transformer and the tokenizer that feeds it."""

    path: Path
    tokenizer_json: str
    meta: dict

    def __post_init__(self) -> None:
        ort = _need_onnx()
        from tokenizers import Tokenizer

        so = ort.SessionOptions()
        threads = os.environ.get("OMP_NUM_THREADS")
        if threads and threads.isdigit() and int(threads) > 0:
            so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        self._session = ort.InferenceSession(str(self.path), so, providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self._session.get_inputs()}
        tok = Tokenizer.from_str(self.tokenizer_json)
        tok.no_padding()
        tok.enable_truncation(int(self.meta["max_tokens"]))
        self._tok = tok

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    @property
    def model_id(self) -> str:
        """Identity of the quantized model, for the embedding cache."""
        m = self.meta
        return f"int8:{m['source_name']}@{m['source_sha256'][:16]}/ort-qint8-per-channel-v{m['format']}"

    def encode(self, texts: Sequence[str], batch_size: int = MAX_BATCH) -> np.ndarray:
        """Unit-norm float32 embeddings, shape (len(texts), dim); batches of at most :data:`MAX_BATCH`."""
        from mrt_fast.embeddings.tiers import padded_batch

        batch_size = max(1, min(int(batch_size), MAX_BATCH))
        enc = [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=True)]
        order = np.argsort([-len(e) for e in enc], kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for s in range(0, len(order), batch_size):
            rows = order[s : s + batch_size]
            ids, mask = padded_batch(enc, rows)
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            h = self._session.run(None, {k: v for k, v in feed.items() if k in self._inputs})[0]
            m = mask[..., None].astype(np.float32)
            v = (h * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
            n = np.linalg.norm(v, axis=1, keepdims=True)
            n[n == 0] = 1.0
            out[rows] = v / n
        return out


def _source(model) -> tuple[Path, str, str]:
    """(source model directory, source weights sha256, readable name) of an int8 model name."""
    from mrt_fast.embeddings.tiers import tier_source

    return tier_source(model, INT8_ALIASES, INT8_PREFIX, "int8")


def int8_path(model, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the quantized model of ``model`` is (or will be) stored."""
    from mrt_fast.embeddings.tiers import tier_path

    return tier_path(model, INT8_ALIASES, INT8_PREFIX, "int8", cache_dir, f"qint8-v{FORMAT_VERSION}.onnx")


_LOADED: dict[str, Int8Model] = {}


def load_int8(model="int8", cache_dir: str | os.PathLike | None = None, *, progress: bool = True) -> Int8Model:
    """The int8 model, from its file if it is there and intact, else exported and quantized now."""
    _need_onnx()
    path = int8_path(model, cache_dir)
    key = str(path)
    if key in _LOADED:
        return _LOADED[key]
    src, sha, name = _source(model)
    tok_json = (src / "tokenizer.json").read_text(encoding="utf-8")
    meta = _read_meta(path)
    if meta is None:
        meta = build(src, path, source_sha256=sha, source_name=name, progress=progress)
    m = Int8Model(path, tok_json, meta)
    _LOADED[key] = m
    return m


def _meta_path(path: Path) -> Path:
    return path.with_suffix(".json")


def _file_sha256(path: Path) -> str:
    from mrt_fast.embeddings.tiers import sha256_file

    return sha256_file(path)


def _read_meta(path: Path) -> dict | None:
    """The recorded meta of an intact file; ``None`` when either file is missing, unreadable or does not match."""
    try:
        meta = json.loads(_meta_path(path).read_text())
        if meta.get("format") != FORMAT_VERSION or not path.is_file() or meta.get("onnx_sha256") != _file_sha256(path):
            return None
        return meta
    except (OSError, ValueError):
        return None


def build(src: Path, path: Path, *, source_sha256: str, source_name: str, progress: bool = True) -> dict:
    """Export the transformer in ``src`` to ONNX, quantize it to int8 into ``path``; returns the meta written."""
    _need_onnx()
    try:
        import torch
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from transformers import AutoModel
    except ImportError as e:
        raise MrtInputError(f"building the int8 model needs torch, transformers and onnx ({e.name} is missing; "
                            "pip install 'mrt_fast[int8]')") from None
    import logging
    import sys
    import warnings

    from mrt_fast._util.files import atomic_path, write_text

    if progress:
        print(f"exporting {source_name} to ONNX and quantizing it to int8 (once)", file=sys.stderr)
    level = logging.getLogger("transformers").level
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            net = AutoModel.from_pretrained(str(src), local_files_only=True).to("cpu").eval()
    except Exception as e:  # noqa: BLE001
        raise MrtInputError(f"cannot load {str(src)!r} to quantize it: {type(e).__name__}: {e}") from None
    finally:
        logging.getLogger("transformers").setLevel(level)

    class _Hidden(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    # a padded example: a mask of all ones can be traced away, which would ignore padding
    ids = torch.tensor([[101, 7592, 2088, 102, 0, 0], [101, 1037, 2936, 2117, 3793, 102]], dtype=torch.long)
    ids = ids.clamp(max=net.config.vocab_size - 1)
    mask = (torch.arange(6)[None, :] < torch.tensor([[4], [6]])).long()
    names = ["input_ids", "attention_mask", "token_type_ids"]
    # both files are written under temp names that a later build cleans if this process is killed
    fp32_path = path.with_name(path.stem + ".fp32.onnx")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(fp32_path) as fp32:
            with warnings.catch_warnings(), torch.inference_mode():
                warnings.simplefilter("ignore")
                torch.onnx.export(
                    _Hidden(net), (ids, mask, torch.zeros_like(ids)), str(fp32), input_names=names,
                    output_names=["last_hidden_state"], opset_version=OPSET, dynamo=False,
                    dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]},
                )
            root = logging.getLogger()
            root_level = root.level
            root.setLevel(logging.ERROR)  # quantize_dynamic logs advice on the root logger
            try:
                with atomic_path(path) as out:
                    quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8, per_channel=True)
            finally:
                root.setLevel(root_level)
    except MrtInputError:
        raise
    except Exception as e:  # noqa: BLE001
        raise MrtInputError(f"cannot export {source_name} to an int8 ONNX model: {type(e).__name__}: {e}") from None
    finally:
        fp32_path.unlink(missing_ok=True)
    import onnxruntime

    meta = {
        "format": FORMAT_VERSION, "method": "torch.onnx export (opset 17), onnxruntime quantize_dynamic QInt8 per channel",
        "source_name": source_name, "source_sha256": source_sha256, "dim": int(net.config.hidden_size),
        "max_tokens": _max_tokens(src), "onnxruntime": onnxruntime.__version__, "torch": torch.__version__,
        "onnx_sha256": _file_sha256(path),
    }
    try:
        write_text(_meta_path(path), json.dumps(meta))
    except OSError as e:
        raise MrtInputError(f"cannot save the int8 model's record to {str(_meta_path(path))!r}: {e}") from None
    return meta

