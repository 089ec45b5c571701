"""The config of ``mrt run``: the YAML file read into a :class:`RunConfig`, its paths resolved,
``--set`` overrides applied, and the data files checked before any model loads.

See docs/guides/pipeline.md for the config reference.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mrt_fast.answers.run_config import check_answers_config
from mrt_fast.datasets.formats import scan
from mrt_fast.errors import MrtInputError

__all__ = ["RunConfig", "STAGES", "SELECT_OWN", "apply_overrides", "check_inputs", "parse_ks"]

STAGES = ("generate", "embed", "score", "select", "train", "evaluate")
TOP_KEYS = {"out_dir", "model", "reward_model", "reward_fn", "embedder", "data", "generate", "select", "train",
        "evaluate", "threads", "baseline", "device", "answers"}
#: keys of the `select` section that are not arguments of `mrt_fast.select`
SELECT_OWN = {"methods", "ks", "n_modes"}


@dataclass
class RunConfig:
    out_dir: str
    model: str
    train_prompts: str
    eval_data: str
    reward_model: str | None = None
    reward_fn: Any = None  # "package.module:function", "builtin:relevance" or a callable (rows -> floats)
    validation_data: str | None = None  # select.ks: auto: prompt_id, prompt, response (default: the candidates)
    embedder: str = "minilm"  # minilm | hashing | a sentence-transformers path
    generate: dict = field(default_factory=dict)
    select: dict = field(default_factory=lambda: {"methods": ["random"], "ks": [1, 2, 4]})
    train: dict = field(default_factory=dict)
    evaluate: dict = field(default_factory=dict)
    threads: int | None = None
    baseline: bool = True  # also evaluate the base model (K = 0 row)
    device: str = "auto"
    answers: dict | None = None  # modes and rewards from the answer itself (mrt_fast.answers.run_config)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, overrides: dict | None = None) -> "RunConfig":
        """The config of a YAML file; its relative paths are relative to the file's folder.

        ``overrides``: dotted keys and values (``{"train.max_steps": 2, "out_dir": "runs/small"}``), applied
        over the file's values; their relative paths are taken from the current directory."""
        import yaml

        path = Path(path)
        if not path.is_file():
            raise MrtInputError(f"config file {str(path)!r} does not exist")
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise MrtInputError(f"config file {str(path)!r} is not valid YAML: {str(e).splitlines()[0]}") from None
        except UnicodeDecodeError as e:
            raise MrtInputError(f"config file {str(path)!r} is not UTF-8 text (byte {e.start}); save it as UTF-8") \
                from None
        if not isinstance(raw, dict):
            raise MrtInputError(f"config file {str(path)!r} must hold a mapping of keys")
        raw = _resolved(raw, path.parent.resolve())
        return cls.from_dict(apply_overrides(raw, overrides or {}))

    @classmethod
    def from_dict(cls, raw: dict, base: Path | None = None) -> "RunConfig":
        bad = sorted(set(raw) - TOP_KEYS)
        if bad:
            raise MrtInputError(f"unknown config key(s) {bad}; known: {sorted(TOP_KEYS)}")
        for key in ("out_dir", "model", "data"):
            if key not in raw:
                raise MrtInputError(f"config needs {key!r}")
        data = raw["data"] or {}
        for key in ("train_prompts", "eval"):
            if key not in data:
                raise MrtInputError(f"config data needs {key!r}")

        def rel(p):
            return None if p is None else os.path.expanduser(os.path.expandvars(str(p)))

        sel = {"methods": ["random"], "ks": [1, 2, 4], **(raw.get("select") or {})}
        return cls(
            out_dir=rel(raw["out_dir"]),
            model=rel(raw["model"]),
            train_prompts=rel(data["train_prompts"]),
            eval_data=rel(data["eval"]),
            reward_model=rel(raw.get("reward_model")),
            reward_fn=raw.get("reward_fn"),
            validation_data=rel(data.get("validation")),
            embedder=raw.get("embedder", "minilm"),
            generate=raw.get("generate") or {},
            select=sel,
            train=raw.get("train") or {},
            evaluate=raw.get("evaluate") or {},
            threads=raw.get("threads"),
            baseline=bool(raw.get("baseline", True)),
            device=raw.get("device", "auto"),
            answers=check_answers_config(raw.get("answers"), raw.get("reward_model"), raw.get("reward_fn")),
        )


#: config keys holding paths of files the run reads or writes (resolved against the YAML's folder)
_PATH_KEYS = (("out_dir",), ("data", "train_prompts"), ("data", "eval"), ("data", "validation"),
              ("select", "warm_data"))
#: config keys that are a local path or a model id (resolved when the path exists beside the YAML)
_MODEL_KEYS = (("model",), ("reward_model",))


def _resolved(raw: dict, base: Path) -> dict:
    """``raw`` with its relative paths made relative to ``base``."""
    import copy

    out = copy.deepcopy(raw)

    def at(keys):
        d = out
        for k in keys[:-1]:
            d = d.get(k) if isinstance(d, dict) else None
            if d is None:
                return None, None
        return (d, keys[-1]) if isinstance(d, dict) and keys[-1] in d else (None, None)

    for keys in _PATH_KEYS + _MODEL_KEYS:
        d, k = at(keys)
        if d is None or d[k] is None:
            continue
        v = os.path.expanduser(os.path.expandvars(str(d[k])))
        if "://" in v or os.path.isabs(v):
            continue
        if keys in _MODEL_KEYS and not (base / v).exists():
            continue  # a model id, not a path
        d[k] = str(base / v)
    return out


def apply_overrides(raw: dict, overrides: dict) -> dict:
    """``raw`` with dotted keys set (``train.max_steps``); an unknown top-level key is refused."""
    import copy

    out = copy.deepcopy(raw)
    for key, value in overrides.items():
        parts = str(key).split(".")
        if not all(parts):
            raise MrtInputError(f"--set {key!r}: a key is a dotted path like train.max_steps")
        if parts[0] not in TOP_KEYS:
            raise MrtInputError(f"--set {key!r}: unknown config key {parts[0]!r}; known: {sorted(TOP_KEYS)}")
        d = out
        for p in parts[:-1]:
            nxt = d.get(p)
            if nxt is None:
                nxt = d[p] = {}
            if not isinstance(nxt, dict):
                raise MrtInputError(f"--set {key!r}: {p!r} holds a value, not a section")
            d = nxt
        d[parts[-1]] = value
    return out


def parse_ks(value: Any) -> list[int] | str:
    if isinstance(value, str):
        if value.strip().lower() == "auto":
            return "auto"
        value = [v for v in value.replace(",", " ").split()]
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = [value]
    try:
        ks = [int(k) for k in value]
    except (TypeError, ValueError):
        raise MrtInputError(f"select.ks must be 'auto' or a list of integers, got {value!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise MrtInputError(f"every K must be >= 1, got {ks}")
    return ks


def check_inputs(cfg: "RunConfig", stages: tuple | list, generating: bool) -> None:
    """Every data file the run will read, checked before any model loads (a wrong path fails
    in a second, not after the model's conversion and the first stages): it is a table
    that can be read, with the columns its stage needs."""
    needs = []
    if generating:
        needs.append(("train prompts", cfg.train_prompts, ["prompt_id", "prompt"]))
    if "evaluate" in stages:
        ref = str(cfg.evaluate.get("reference", "reference"))
        needs.append(("evaluation data", cfg.eval_data, ["prompt_id", "prompt", ref]))
    if cfg.validation_data:
        needs.append(("validation data", cfg.validation_data, ["prompt_id", "prompt", "response"]))
    for role, path, cols in needs:
        if not path:
            raise MrtInputError(f"the config names no {role} file")
        names = scan(Path(path)).collect_schema().names()
        missing = [c for c in cols if c not in names]
        if missing:
            raise MrtInputError(f"{role} {str(path)!r} has no column(s) {missing} (it has {names})")

