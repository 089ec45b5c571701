"""The settings each output of an ``mrt run`` out_dir was made with: record, compare, invalidate.

A stage's record holds the effective settings its output was made with
(defaults resolved, data files fingerprinted) and the digest of the record of
each upstream stage it was made from, so a changed upstream changes every
record below it. Records live in ``out_dir/.mrt/stages.json``, keyed by stage
(``generate``, ``embed``, ``score``, ``modes``, ``diagnose``, and per cell
``select/<cell>``, ``train/<cell>``, ``evaluate/<cell>``). A rerun compares
the record of every output on disk with the one the current config would
write: an output made with other settings is refused, or with ``redo`` its
files (and those of the stages below it) are deleted so that it is made again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mrt_fast._util.files import write_text
from mrt_fast.datasets.manifest import part_check
from mrt_fast.errors import MrtInputError

#: where the records of an out_dir are kept
RECORDS = Path(".mrt") / "stages.json"

#: files above this size are fingerprinted by size and modification time, not by content
HASH_LIMIT = 256 << 20

#: settings that change how a stage runs, not what it makes
OPERATIONAL = {"device", "batch_size", "max_batch", "shard_prompts", "vllm_kwargs", "log_every", "save_steps",
               "save_total_limit", "resume", "report_to", "log_pair_losses", "gradient_checkpointing"}

#: settings that hold the fingerprint of files (`data_fingerprint`, `model_identity`)
FINGERPRINTED = {"model", "reward_model", "train_prompts", "eval_data", "validation"}

_FACILITY = ("alpha", "eps", "k_max", "kernel", "optimizer")
_MODES = ("n_modes", "max_mode_cosine")
#: selection knobs a method does not read (changing them leaves its kept rows as they are)
NOT_READ = {"random": _FACILITY + _MODES, "top": _FACILITY + _MODES + ("seed",),
            "diverse": ("alpha", "seed") + _MODES, "grades": _MODES + ("seed",), "stratified": _FACILITY}

#: the files of a run directory that mrt run writes (train, then evaluate)
TRAIN_FILES = ("adapter", "checkpoints", "train_log.jsonl", "train_config.json")
EVAL_FILES = ("metrics.json", "samples.parquet")


def plain(value: Any) -> Any:
    """``value`` as JSON values (tuples as lists, anything else as its string)."""
    return json.loads(json.dumps(value, default=str, sort_keys=True))


def digest(record: dict) -> str:
    return hashlib.blake2b(json.dumps(record, sort_keys=True).encode(), digest_size=12).hexdigest()


def make_record(settings: dict, upstream: dict[str, dict] | None = None) -> dict:
    """A stage's record: its settings and the digests of the upstream records it was made from."""
    return {"settings": plain(settings), "upstream": {k: digest(v) for k, v in (upstream or {}).items()}}


def effective(settings: dict) -> dict:
    """A config's settings without those that only change how a stage runs."""
    return {k: v for k, v in settings.items() if k not in OPERATIONAL}


def select_settings(parameters: dict, method: str) -> dict:
    """The selection options a method reads (``SelectOptions.parameters()``, canonical method)."""
    return {k: v for k, v in parameters.items() if k not in NOT_READ.get(method, ())}


def hook_identity(hook: Any, fn: Any = None) -> dict | None:
    """A reward hook by its code: its name (the string it was given as, or a callable's qualified
    name) and `code_fingerprint` of the function it loads to (``fn``; ``hook`` itself when it is a
    callable). A hook without a fingerprint gets a record of its own each run (``"code": None``,
    why, and a fresh token), so that nothing made with it is reused."""
    if hook is None:
        return None
    name = hook if isinstance(hook, str) else \
        f"{getattr(hook, '__module__', '?')}:{getattr(hook, '__qualname__', type(hook).__qualname__)}"
    fn = hook if fn is None and callable(hook) else fn
    if isinstance(hook, str) and hook.startswith("builtin:") and fn is None:
        from mrt_fast.llm.reward import relevance_reward

        fn = relevance_reward
    code, why = code_fingerprint(fn)
    if code is None:
        import secrets

        return {"name": name, "code": None, "why": why, "run": secrets.token_hex(8)}
    return {"name": name, "code": code}


def code_fingerprint(fn: Any) -> tuple[dict | None, str | None]:
    """The content hash of the file that defines ``fn`` and of its source (`inspect`), either
    where the other cannot be had; ``(None, why)`` when neither can (a function made by ``exec``
    or in a C extension, a file since deleted). What the code reads at run time (its globals,
    closed-over values, other modules, files) is not part of it."""
    import functools
    import inspect

    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    if target is None:
        return None, "no function to read"
    target = inspect.unwrap(target) if inspect.isfunction(target) or inspect.ismethod(target) else target
    if not (inspect.isfunction(target) or inspect.ismethod(target) or inspect.isclass(target)
            or inspect.isbuiltin(target)):
        target = type(target)  # a callable object: its class holds its code
    out = {}
    try:
        f = inspect.getsourcefile(target)
    except TypeError:
        f = None
    if f and os.path.isfile(f):
        out["file"] = hashlib.blake2b(Path(f).read_bytes(), digest_size=16).hexdigest()
    try:
        out["source"] = hashlib.blake2b(inspect.getsource(target).encode(), digest_size=16).hexdigest()
    except (OSError, TypeError):
        pass
    if not out:
        return None, f"neither the source nor the file of {getattr(target, '__qualname__', target)!r} can be read"
    return out, None


def embedder_identity(spec: str, embedder: Any = None) -> str:
    """The embedder as a name: the config's spec, or the class of an embedder passed in."""
    return spec if embedder is None else f"{type(embedder).__module__}:{type(embedder).__qualname__}"


def data_fingerprint(path: str | os.PathLike | None) -> Any:
    """Size and content hash of a data file (of each file of a directory); size and modification time
    above `HASH_LIMIT`; the name itself for what is not a local path."""
    if path is None:
        return None
    p = Path(path)
    if "://" in str(path) or not p.exists():
        return str(path)
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    out = {}
    for f in files:
        st = f.stat()
        key = f.name if f == p else str(f.relative_to(p))
        out[key] = part_check(f) if st.st_size <= HASH_LIMIT else {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    return out


def model_identity(spec: Any) -> Any:
    """A model as its spec and, for a local file or folder (``pkg://`` resolved), the fingerprint of
    its files (`data_fingerprint`), so another model saved at the same path is a change; a hub id is
    its name."""
    if spec is None or not isinstance(spec, (str, os.PathLike)):
        return None if spec is None else f"{type(spec).__module__}:{type(spec).__qualname__}"
    from mrt_fast.llm.models import resolve_model_path

    try:
        where = resolve_model_path(str(spec))
    except MrtInputError:
        return str(spec)
    return {"spec": str(spec), "files": data_fingerprint(where)}


def read_records(out_dir: Path) -> dict[str, dict] | None:
    """The records of ``out_dir`` (None when it has none)."""
    f = Path(out_dir) / RECORDS
    if not f.exists():
        return None
    try:
        return json.loads(f.read_text())["stages"]
    except (ValueError, KeyError, TypeError):
        raise MrtInputError(f"{str(f)!r} is not a record of mrt run's stages; delete it and rerun with "
                            "--redo-changed") from None


@dataclass
class Records:
    """The records of an out_dir, written atomically after each change."""

    out_dir: Path
    stages: dict[str, dict] = field(default_factory=dict)

    def set(self, key: str, record: dict) -> None:
        if self.stages.get(key) != record:
            self.stages[key] = record
            write_text(self.out_dir / RECORDS, json.dumps({"version": 1, "stages": self.stages}, indent=1))

    def mark(self) -> None:
        """Write the record file if there is none yet: the out_dir is mrt run's from now on."""
        if not (self.out_dir / RECORDS).exists():
            write_text(self.out_dir / RECORDS, json.dumps({"version": 1, "stages": self.stages}, indent=1))

    def drop(self, keys) -> None:
        for k in keys:
            self.stages.pop(k, None)
        write_text(self.out_dir / RECORDS, json.dumps({"version": 1, "stages": self.stages}, indent=1))


def leaves(settings: Any, prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted leaf keys (``{"generate": {"n": 4}}`` -> ``{"generate.n": 4}``)."""
    if not isinstance(settings, dict) or not settings:
        return {prefix: settings} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in settings.items():
        out.update(leaves(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _shown(value: Any, width: int = 40) -> str:
    text = "None" if value is None else repr(value) if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def differences(old: dict | None, new: dict, few: int = 3) -> str:
    """What changed between two records, in a few words: the dotted leaf keys that differ
    (``select.alpha 0.75 -> 0.5``, ``generate.temperature 1.0 -> 0.5``)."""
    if old is None:
        return "made without a record of its settings"
    o, n = old.get("settings", {}), new["settings"]
    hook = n.get("reward_fn")
    if isinstance(hook, dict) and hook.get("code") is None:
        return (f"reward_fn {hook.get('name')!r} has no fingerprint of its code ({hook.get('why')}), so what "
                "was made with it is not reused")
    diff = []
    if isinstance(hook, dict) and isinstance(o.get("reward_fn"), dict) and o["reward_fn"] != hook \
            and o["reward_fn"].get("name") == hook.get("name"):
        diff.append(f"reward_fn {hook['name']!r}: its code changed")
        o, n = {k: v for k, v in o.items() if k != "reward_fn"}, {k: v for k, v in n.items() if k != "reward_fn"}
    lo, ln = leaves(o), leaves(n)
    changed = [k for k in sorted(set(lo) | set(ln)) if lo.get(k) != ln.get(k)]
    files = []  # a fingerprint of files (data, a model's files) is named, not spelled out
    for k in changed:
        top, _, rest = k.partition(".")
        if top in FINGERPRINTED and rest and not rest.startswith("spec"):
            if top not in files:
                files.append(top)
                diff.append(f"{top}: its files changed")
        else:
            diff.append(f"{k} {_shown(lo.get(k))} -> {_shown(ln.get(k))}")
    up = sorted(k for k in set(old.get("upstream", {})) | set(new["upstream"])
                if old.get("upstream", {}).get(k) != new["upstream"].get(k))
    diff += [f"its {k} changed" for k in up]
    return ", ".join(diff[:few]) + (f" and {len(diff) - few} more" if len(diff) > few else "")


def refusal(out_dir: Path, changed: dict[str, str], legacy: bool, few: int = 3) -> MrtInputError:
    """The one-line error of an out_dir whose outputs were made with other settings."""
    how = ("write to a new out_dir, or rerun with --redo-changed (Python: run(..., redo_changed=True)) to redo "
           "these stages and those that depend on them")
    more = f" and {len(changed) - few} more" if len(changed) > few else ""
    if legacy:
        return MrtInputError(f"out_dir {str(out_dir)!r} was made without a record of its settings (its "
                             f"{', '.join(list(changed)[:few])}{more} may be of other settings): {how}")
    items = [f"{k} ({why})" for k, why in list(changed.items())[:few]]
    return MrtInputError(f"out_dir {str(out_dir)!r} holds outputs made with other settings: {'; '.join(items)}{more}: "
                         f"{how}")


def outputs_of(key: str) -> list[Path]:
    """The paths (relative to the out_dir) a stage writes."""
    stage, _, cell = key.partition("/")
    if stage == "generate":
        return [Path("candidates.parquet"), Path("candidates.parquet.parts")]
    if stage == "embed":
        return [Path("embedded.parquet"), Path("embedded.parquet.parts")]
    if stage == "score":
        return [Path("scored.parquet"), Path("scored.parquet.parts")]
    if stage == "diagnose":
        return [Path("diagnose") / n for n in ("losses.parquet", "losses.parquet.parts", "pairs.parquet", "warm.json",
                                               "warm", "report.json", "variance.png")]
    if stage == "select":
        return [Path("select") / f"{cell}.parquet"]
    if stage == "train":
        return [Path("runs") / cell / n for n in TRAIN_FILES]
    if stage == "evaluate":
        return [Path("runs") / cell / n for n in EVAL_FILES]
    return []  # modes: a column of scored.parquet, dropped by the pipeline


def remove_outputs(out_dir: Path, keys) -> None:
    """Delete the files the stages ``keys`` wrote (and the folders left empty by it)."""
    for key in keys:
        for rel in outputs_of(key):
            p = Path(out_dir) / rel
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
            for d in (p.parent, p.parent.parent):
                if d != Path(out_dir) and d.is_dir() and not any(d.iterdir()):
                    d.rmdir()
