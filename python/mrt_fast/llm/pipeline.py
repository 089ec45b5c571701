"""The whole LLM experiment from one YAML file: generate -> embed -> score -> [diagnose] -> select -> train -> evaluate.

Every stage writes its output under ``out_dir`` and is skipped when that output
already exists, so a run that stopped resumes where it stopped and a grid can
be extended (add a method or a K, run again: only the new cells train).

Layout of ``out_dir``::

    candidates.parquet (+ .parts/)   overgenerated candidates (resumable)
    embedded.parquet                 + embedding column
    scored.parquet                   + reward column (reward model or reward hook), + mode (stratified)
    diagnose/                        select.ks: auto: losses.parquet, report.json, variance.png
    select/<method>_k<K>.parquet     kept rows per cell
    runs/<method>_k<K>/              adapter/, train_log.jsonl, metrics.json, samples.parquet
    results.csv / results.md / results.png

See docs/pipeline.md for the config reference.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mrt_fast.llm.cells import cell_name, cells_on_disk, kept_key, parse_cell
from mrt_fast.llm.run_dir import check_out_dir
from mrt_fast.llm.models import set_threads
from mrt_fast.llm import stage_records as sr
from mrt_fast.embeddings.embedders import make_embedder
from mrt_fast.datasets.formats import read_table, scan, write_table
from mrt_fast.tables.arrays import require_columns
from mrt_fast.answers.run_config import answer_columns, check_answers_config
from mrt_fast.errors import MrtInputError

STAGES = ("generate", "embed", "score", "select", "train", "evaluate")
_TOP = {"out_dir", "model", "reward_model", "reward_fn", "embedder", "data", "generate", "select", "train",
        "evaluate", "threads", "baseline", "device", "answers"}
#: keys of the `select` section that are not arguments of `mrt_fast.select`
_SELECT_OWN = {"methods", "ks", "n_modes"}


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
            raw = yaml.safe_load(path.read_text()) or {}
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
        bad = sorted(set(raw) - _TOP)
        if bad:
            raise MrtInputError(f"unknown config key(s) {bad}; known: {sorted(_TOP)}")
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
        if parts[0] not in _TOP:
            raise MrtInputError(f"--set {key!r}: unknown config key {parts[0]!r}; known: {sorted(_TOP)}")
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


def _log(msg: str, progress: bool) -> None:
    if progress:
        from rich.markup import escape

        from mrt_fast._util.messages import rich_console

        rich_console(stderr=True).print(f"[bold cyan]mrt run[/] {escape(msg)}")


def _parse_ks(value: Any) -> list[int] | str:
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


class StagePlan:
    """The record each output of ``out_dir`` would get under the current settings
    (`mrt_fast.llm.stage_records`), and the check of the outputs already there."""

    def __init__(self, cfg: RunConfig, gcfg, tcfg, ecfg, sel_kw: dict, auto: dict | None, embedder_id: str,
                 hook_id: dict | None, grid: set[str] | None = None):
        self.cfg, self.tcfg, self.ecfg, self.sel_kw, self.auto = cfg, tcfg, ecfg, sel_kw, auto
        self.grid = grid  # the cells of this run's grid (None: every cell of its methods, K from the advisor)
        self.embedder_id, self.hook_id = embedder_id, hook_id
        self.model = sr.model_identity(cfg.model)
        self.reward_model = sr.model_identity(cfg.reward_model)
        self.gen = sr.make_record({"model": self.model, "train_prompts": sr.data_fingerprint(cfg.train_prompts),
                                   "generate": sr.effective(asdict(gcfg))})
        self.embed = sr.make_record({"embedder": embedder_id}, {"generate": self.gen})
        self.score = sr.make_record({"reward_model": self.reward_model, "reward_fn": hook_id,
                                     **({"answers": cfg.answers} if cfg.answers is not None else {}),
                                     "train_prompts": sr.data_fingerprint(cfg.train_prompts)}, {"embed": self.embed})
        self.modes = sr.make_record({"n_modes": cfg.select.get("n_modes"), "seed": int(cfg.select.get("seed", 0))},
                                    {"score": self.score})
        self.eval_data = sr.data_fingerprint(cfg.eval_data)
        self.out_dir = Path(cfg.out_dir)

    def expected(self, key: str, kept: str | None = None, same_as: str | None = None) -> dict:
        """The record of stage ``key`` (``select/<cell>`` ...); ``kept``: the cell's kept rows' key,
        ``same_as``: the identical cell whose model it evaluates."""
        from mrt_fast.selection.options import METHODS, SelectOptions

        stage, _, name = key.partition("/")
        if stage in ("generate", "embed", "score", "modes"):
            return getattr(self, {"generate": "gen"}.get(stage, stage))
        if stage == "diagnose":
            val = self.cfg.validation_data
            auto = self.auto or {}
            warm = auto.get("warm_pilot", "none")
            return sr.make_record({"model": self.model, "validation": sr.data_fingerprint(val),
                                   "validation_prompts": auto.get("validation_prompts"),
                                   "max_length": self.tcfg.max_length, "prompt_format": self.tcfg.prompt_format,
                                   "dtype": self.tcfg.dtype,
                                   **({} if warm == "none" else {"warm_pilot": {
                                       "mode": warm, "steps": auto.get("warm_steps") if warm == "lora" else None,
                                       "data": sr.data_fingerprint(auto.get("warm_data"))}})},
                                  {} if val else {"score": self.score})
        method, k = parse_cell(name)
        if stage == "evaluate":
            up = {} if method == "base" else {f"train/{name}": self.expected(f"train/{name}", kept)}
            if same_as is not None:
                up[f"train/{same_as}"] = self.expected(f"train/{same_as}", self._kept_on_disk(same_as))
            return sr.make_record({"model": self.model, "eval_data": self.eval_data,
                                   "evaluate": sr.effective(asdict(self.ecfg)), "reward_model": self.reward_model,
                                   "reward_fn": self.hook_id, "embedder": self.embedder_id, "same_as": same_as}, up)
        canon = METHODS[method.lower()]
        if stage == "select":
            params = SelectOptions(k=k, method=canon, **self.sel_kw).parameters()
            up = {"score": self.score, **({"modes": self.modes} if canon == "stratified" else {})}
            return sr.make_record(sr.select_settings(params, canon), up)
        # a trained cell is keyed by what it trains on (its kept rows' content), not by how they were
        # selected: a selection made again that keeps the same rows reuses the trained model
        return sr.make_record({"model": self.model, "train": sr.effective(asdict(self.tcfg)), "kept_key": kept})

    def _kept_on_disk(self, name: str) -> str | None:
        f = self.out_dir / "select" / f"{name}.parquet"
        return kept_key(pl.read_parquet(f)) if f.exists() else None

    def in_grid(self, name: str) -> bool:
        """Whether cell ``name`` belongs to this run's grid (cells outside it are left as they are)."""
        if self.grid is None:
            method = parse_cell(name)[0]
            return self.cfg.baseline if method == "base" else method in self.cfg.select.get("methods", ["random"])
        return name in self.grid

    def present(self) -> dict[str, dict | None]:
        """The stages with an output in out_dir: key -> what is needed to rebuild its record (the
        cells of this run's grid only)."""
        from mrt_fast.selection.options import METHODS

        out = self.out_dir
        found: dict[str, dict] = {}
        if (out / "candidates.parquet").exists() or (out / "candidates.parquet.parts").exists():
            found["generate"] = {}
        for key, f in (("embed", "embedded.parquet"), ("score", "scored.parquet")):
            if (out / f).exists():
                found[key] = {}
        if (out / "scored.parquet").exists() and "mode" in pl.read_parquet_schema(out / "scored.parquet"):
            found["modes"] = {}
        if self.auto is not None and (out / "diagnose" / "losses.parquet").exists():
            found["diagnose"] = {}
        runs = out / "runs"
        names = ({f.stem for f in (out / "select").glob("*.parquet")}
                 | ({d.name for d in runs.iterdir() if d.is_dir()} if runs.is_dir() else set()))
        for name in sorted(names):
            cell = parse_cell(name)
            if cell is None or (cell[0] != "base" and cell[0].lower() not in METHODS) or not self.in_grid(name):
                continue
            run_dir = out / "runs" / name
            if (out / "select" / f"{name}.parquet").exists():
                found[f"select/{name}"] = {}
            kept = self._kept_on_disk(name) if cell[0] != "base" else None
            if any((run_dir / f).exists() for f in sr.TRAIN_FILES):
                found[f"train/{name}"] = {"kept": kept}
            if (run_dir / "metrics.json").exists():
                found[f"evaluate/{name}"] = {"kept": kept}
        return found

    def check(self, out: Path, redo: bool) -> sr.Records:
        """Refuse (one line) an out_dir holding outputs made with other settings; with ``redo``,
        delete those outputs and everything made from them. Returns the records to update."""
        old = sr.read_records(out) if out.is_dir() else None
        present = self.present() if out.is_dir() else {}
        legacy = old is None and bool(present)
        old = old or {}
        changed = {}
        for key, kw in present.items():
            if key.startswith(("train/", "evaluate/")) and kw.get("kept") is None and key in old \
                    and not key.endswith("/base"):
                continue  # its selection is made again first; then the run checks its record against it
            if key.startswith("evaluate/"):
                kw = {**kw, "same_as": (old.get(key) or {}).get("settings", {}).get("same_as")}
            new = self.expected(key, **kw)
            if old.get(key) != new:
                changed[key] = sr.differences(old.get(key), new)
        if changed and not redo:
            raise sr.refusal(out, changed, legacy)
        records = sr.Records(out, old)
        if changed:
            sr.remove_outputs(out, changed)
            if "modes" in changed and "score" not in changed:
                write_table(pl.read_parquet(out / "scored.parquet").drop("mode"), out / "scored.parquet")
            records.drop(changed)
        return records


def run(config: RunConfig | dict | str | os.PathLike, *, embedder=None, reward_fn=None, progress: bool = True,
        stages: tuple[str, ...] = STAGES, redo_changed: bool = False) -> pl.DataFrame:
    """Run the experiment grid; returns the results table (one row per method x K).

    ``reward_fn``: a reward hook (a callable over the candidate rows, see
    `mrt_fast.llm.reward.load_reward_fn`) overriding the config's ``reward_fn``.
    An output already in ``out_dir`` is reused only when it was made with the
    current settings (`mrt_fast.llm.stage_records`); one made with other
    settings is refused before any work, or with ``redo_changed`` deleted with
    everything made from it, and made again.
    """
    from mrt_fast.llm.evaluate import EvalConfig, evaluate
    from mrt_fast.llm.generate import GenerationConfig, generate
    from mrt_fast.llm.reward import load_reward_fn, score, score_with
    from mrt_fast.selection.select import select
    from mrt_fast.selection.options import METHODS
    from mrt_fast.llm.train import TrainConfig, train

    if isinstance(config, (str, os.PathLike)):
        config = RunConfig.from_yaml(config)
    elif isinstance(config, dict):
        config = RunConfig.from_dict(config)
    cfg = config
    set_threads(cfg.threads)
    bad = [s for s in stages if s not in STAGES]
    if bad:
        raise MrtInputError(f"unknown stage(s) {bad}; stages are {STAGES}")
    methods = [str(m) for m in cfg.select.get("methods", ["random"])]
    for m in methods:
        if m.lower() not in METHODS:
            raise MrtInputError(f"unknown selection method {m!r}; known: {sorted(METHODS)}")
    ks = _parse_ks(cfg.select.get("ks", [1, 2, 4]))
    from mrt_fast.llm.advisor import AUTO_KEYS, auto_settings

    auto = auto_settings(cfg.select) if ks == "auto" else None
    sel_kw = {k: v for k, v in cfg.select.items() if k not in _SELECT_OWN and k not in AUTO_KEYS}
    tcfg = TrainConfig.from_dict({"device": cfg.device, **cfg.train})
    ecfg = EvalConfig.from_dict({"device": cfg.device, **cfg.evaluate})
    gcfg = GenerationConfig(**{"device": cfg.device, **cfg.generate})
    rfn = reward_fn if reward_fn is not None else cfg.reward_fn
    if cfg.reward_model and rfn is not None:
        raise MrtInputError("set either reward_model or reward_fn, not both")
    builtin_hook = isinstance(rfn, str) and rfn.startswith("builtin:")
    reward_hook = None if rfn is None or builtin_hook else load_reward_fn(rfn)
    out = Path(cfg.out_dir)
    check_out_dir(out, sr.RECORDS)
    check_inputs(cfg, stages, generating=not (out / "candidates.parquet").exists())
    grid = None if auto is not None else \
        {cell_name(m, k) for m in methods for k in ks} | ({"base"} if cfg.baseline else set())
    plan = StagePlan(cfg, gcfg, tcfg, ecfg, sel_kw, auto, sr.embedder_identity(cfg.embedder, embedder),
                     sr.hook_identity(rfn, reward_hook), grid)
    records = plan.check(out, redo_changed)
    out.mkdir(parents=True, exist_ok=True)
    records.mark()
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2, default=str))
    from mrt_fast.llm.models import is_gguf, materialize_gguf

    if is_gguf(cfg.model):  # dequantise once, not once per stage and cell
        _log(f"dequantise {cfg.model} -> {out / 'base_model'}", progress)
        model = materialize_gguf(cfg.model, out / "base_model")
    else:
        model = cfg.model
    emb = embedder

    def get_embedder():
        nonlocal emb
        if emb is None:
            emb = make_embedder(cfg.embedder)
        return emb

    if builtin_hook:  # a builtin hook reads the embedder: loaded once it is needed
        reward_hook = load_reward_fn(rfn, get_embedder())

    # 1. generate
    cand = out / "candidates.parquet"
    prompts_tab = None
    if not cand.exists():
        if "generate" not in stages:
            raise MrtInputError(f"{cand} is missing and the generate stage is not run")
        _log(f"generate: n={gcfg.n} per prompt -> {cand}", progress)
        records.set("generate", plan.expected("generate"))
        prompts_tab = read_table(cfg.train_prompts)
        require_columns(prompts_tab, ["prompt_id", "prompt"], "train prompts")
        generate(prompts_tab.select("prompt_id", "prompt"), cand, model, gcfg, progress=progress)
    # 2. embed
    embedded = out / "embedded.parquet"
    if not embedded.exists():
        _log("embed candidates", progress)
        records.set("embed", plan.expected("embed"))
        df = pl.read_parquet(cand)
        e = np.asarray(get_embedder()(df["response"].fill_null("").to_list()), dtype=np.float32)
        df = df.with_columns(pl.Series("embedding", e).cast(pl.Array(pl.Float32, e.shape[1])))
        write_table(df, embedded)
    # 3. score (and modes when stratified is asked)
    scored = out / "scored.parquet"
    if not scored.exists():
        records.set("score", plan.expected("score"))
        df = pl.read_parquet(embedded)
        if cfg.reward_model:
            _log(f"score with {cfg.reward_model}", progress)
            df = score(df, cfg.reward_model, device=cfg.device, progress=progress)
        elif reward_hook is not None:
            _log(f"score with reward_fn {rfn if isinstance(rfn, str) else getattr(rfn, '__name__', 'hook')}",
                 progress)
            if prompts_tab is None:
                prompts_tab = read_table(cfg.train_prompts)
            extra = [c for c in prompts_tab.columns if c not in df.columns or c == "prompt_id"]
            rows = df.select("prompt_id", "prompt", "response")
            if len(extra) > 1:
                rows = rows.join(prompts_tab.select(extra).with_columns(pl.col("prompt_id").cast(df["prompt_id"].dtype)),
                                 on="prompt_id", how="left", maintain_order="left")
            df = df.with_columns(score_with(rows, reward_hook)["reward"])
        if cfg.answers is not None:  # the answer is the mode, the checker's verdict the reward
            _log(f"answers: extract {cfg.answers.get('extract', 'last_number')}", progress)
            df = answer_columns(df, cfg.answers, read_table(cfg.train_prompts) if prompts_tab is None else prompts_tab)
            if "mode" in df.columns:
                records.set("modes", plan.expected("modes"))
        write_table(df, scored)
    pool = pl.read_parquet(scored)
    if any(METHODS[m.lower()] == "stratified" for m in methods) and "mode" not in pool.columns:
        from mrt_fast.selection.modes import pool_modes

        _log("modes of each pool (k-means on the embeddings) for stratified", progress)
        records.set("modes", plan.expected("modes"))
        pool = pool_modes(pool, n_modes=cfg.select.get("n_modes"), seed=int(cfg.select.get("seed", 0)))
        write_table(pool, scored)
    has_reward = "reward" in pool.columns
    # 3b. diagnose: K from the variance advisor
    advice = None
    if auto is not None:
        from mrt_fast.llm.advisor import diagnose, ks_to_train, validation_pairs, warm_up_rows

        pairs = validation_pairs(cfg.validation_data if cfg.validation_data else pool,
                                 auto["validation_prompts"])
        warm_data = None
        if auto["warm_pilot"] == "lora":
            warm_data = read_table(auto["warm_data"]) if auto["warm_data"] else warm_up_rows(pool, pairs)
        who = "base-model" if auto["warm_pilot"] == "none" else f"warm pilot ({auto['warm_pilot']})"
        _log(f"diagnose: {who} losses of {pairs.height} validation pairs -> K*", progress)
        records.set("diagnose", plan.expected("diagnose"))
        advice = diagnose(pairs, model, out / "diagnose", cost_prompt=auto["cost_prompt"],
                          cost_response=auto["cost_response"], budget=auto.get("budget"), k_max=gcfg.n,
                          n_boot=auto["n_boot"], seed=int(cfg.select.get("seed", 0)), max_length=tcfg.max_length,
                          prompt_format=tcfg.prompt_format, device=cfg.device, dtype=tcfg.dtype,
                          batch_size=ecfg.batch_size, progress=progress, warm_pilot=auto["warm_pilot"],
                          warm_data=warm_data, warm_steps=auto["warm_steps"])
        ks = ks_to_train(advice, auto["neighbours"], gcfg.n)
        ident = "" if advice.get("identified", True) else " (ratio not identified: the K its interval supports)"
        _log(f"diagnose: V_x={advice['v_x']:.4g}, V_y|x={advice['v_y_given_x']:.4g}, K*={advice['k_star']} "
             f"-> train K in {ks}{ident}", progress)
    # 4-6. select, train, evaluate each cell; cells with the same kept rows train one model
    eval_df = read_table(cfg.eval_data)
    rows = []
    cells = [(None, 0)] if cfg.baseline else []
    cells += [(m, k) for m in methods for k in ks]
    trained_by: dict[str, str] = {}  # kept rows' key -> the first cell of this grid that holds them
    n_eval: set = set()  # the number of evaluation prompts of each cell's metrics
    for method, k in cells:
        name = cell_name(method, k)
        run_dir = out / "runs" / name
        metrics_f = run_dir / "metrics.json"
        adapter = None
        same_as = key = None
        fresh = not metrics_f.exists()
        if method is not None:
            canon = METHODS[method.lower()]
            if canon in ("top", "grades") and not has_reward:
                raise MrtInputError(f"method {method!r} needs rewards: set reward_model or reward_fn in the config")
            sel_f = out / "select" / f"{name}.parquet"
            if not sel_f.exists():
                _log(f"select {name}", progress)
                records.set(f"select/{name}", plan.expected(f"select/{name}"))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    kept = select(pool, k, canon, **sel_kw)
                write_table(kept, sel_f)
            kept = pl.read_parquet(sel_f)
            key = kept_key(kept)
            want = plan.expected(f"train/{name}", key)
            if records.stages.get(f"train/{name}", want) != want:  # selected again, and it keeps other rows
                stale = [f"train/{name}", f"evaluate/{name}"]
                sr.remove_outputs(out, stale)
                records.drop(stale)
                fresh = True
            records.set(f"train/{name}", want)
            same_as = trained_by.setdefault(key, name)
            same_as = None if same_as == name else same_as
            adapter = run_dir / "adapter"
            if same_as is not None and not (adapter / "adapter_config.json").exists():
                adapter = out / "runs" / same_as / "adapter"  # the identical cell's model, not trained again
                twin_metrics = out / "runs" / same_as / "metrics.json"
                if fresh and twin_metrics.exists():
                    _log(f"{name} keeps the same rows as {same_as}: its model and metrics are reused", progress)
                    run_dir.mkdir(parents=True, exist_ok=True)
                    m = json.loads(twin_metrics.read_text())
                    records.set(f"evaluate/{name}", plan.expected(f"evaluate/{name}", key, same_as))
                    metrics_f.write_text(json.dumps({**m, "same_as": same_as}, indent=2))
            if not (adapter / "adapter_config.json").exists():
                if "train" not in stages:
                    continue
                _log(f"train {name}: {tcfg.max_steps} optimizer steps", progress)
                cols = ["prompt_id", "prompt", "response"] + (["weight"] if "weight" in kept.columns else [])
                train(kept.select(cols), model, run_dir, tcfg, progress=progress)
        twin = same_as if adapter is not None and adapter != run_dir / "adapter" else None
        had = records.stages.get(f"evaluate/{name}")
        if metrics_f.exists() and had is not None and had != plan.expected(f"evaluate/{name}", key, twin):
            sr.remove_outputs(out, [f"evaluate/{name}"])  # its model is another one now
            records.drop([f"evaluate/{name}"])
            fresh = True
        if not metrics_f.exists():
            if "evaluate" not in stages:
                continue
            _log(f"evaluate {name}", progress)
            records.set(f"evaluate/{name}", plan.expected(f"evaluate/{name}", key, twin))
            t0 = time.time()
            m = evaluate(eval_df, model, adapter=adapter, config=ecfg, embedder=get_embedder(),
                         reward_model=cfg.reward_model, reward_fn=reward_hook,
                         samples_out=run_dir / "samples.parquet", progress=progress)
            m["eval_seconds"] = time.time() - t0
            run_dir.mkdir(parents=True, exist_ok=True)
            metrics_f.write_text(json.dumps(m, indent=2))
        m = json.loads(metrics_f.read_text())
        n_eval.add(m.get("n_prompts"))
        row = results_row(method or "base", k, m, "new" if fresh and same_as is None else "reused", same_as)
        if advice is not None:
            from mrt_fast.llm.advisor import as_float

            lo, hi = (as_float(v) for v in advice["k_star_ci"])
            row.update({"v_x": as_float(advice["v_x"]), "v_y_given_x": as_float(advice["v_y_given_x"]),
                        "k_star": as_float(advice["k_star"]), "k_star_lo": lo, "k_star_hi": hi,
                        "k_best": int(advice["k_best"])})
        rows.append(row)
    here = {cell_name(m, k) for m, k in cells}
    outside = cells_on_disk(out).keys() - here
    if outside:
        _log(f"{len(outside)} cell{'s' * (len(outside) > 1)} outside the grid kept, not reported "
             f"({', '.join(sorted(outside)[:4])}{' ...' if len(outside) > 4 else ''})", progress)
    rank = {m: i for i, m in enumerate(["base"] + methods)}
    rows.sort(key=lambda r: (rank.get(r["method"], len(rank)), r["method"], r["K"]))
    results = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()
    if rows:
        write_table(results, out / "results.csv")
        (out / "results.md").write_text(results_markdown(results))
        plot_results(results, out / "results.png", n_prompts=max(n_eval - {None}, default=eval_df.height))
    return results


#: the metrics of a results row, each with its standard error over the evaluation prompts
RESULT_METRICS = ("ref_loss", "reward", "coverage", "diversity")


def results_row(method: str, k: int, metrics: dict, cell: str, same_as: str | None) -> dict:
    """One row of results.csv: the cell, its metrics (and their ``_se``), how it was obtained
    (``cell``: new, or reused from disk or from an identical cell) and the identical cell it shares
    its model with (``same_as``)."""
    row = {"method": method, "K": k, **{key: metrics.get(key) for key in RESULT_METRICS},
           **{key: v for key, v in metrics.items() if key.startswith("pass@") and not key.endswith("_se")}}
    row.update({f"{key}_se": metrics.get(f"{key}_se") for key in list(row)[2:]})
    row.update(cell=cell, same_as=same_as)
    return row


def results_markdown(results: pl.DataFrame) -> str:
    """The results as a markdown table in the shape of the paper's Table 4 (method shown once per block);
    a metric with a standard error is shown as mean ± 1.96 se (its 95% interval over prompts)."""
    cols = [c for c in results.columns if not (c.endswith("_se") and c[:-3] in results.columns)]
    head = {"method": "Strategy", "K": "K", "ref_loss": "Ref. loss ↓", "reward": "Reward ↑",
            "coverage": "Coverage ↑", "diversity": "Diversity ↑"}
    lines = ["| " + " | ".join(head.get(c, c) for c in cols) + " |", "|" + "---|" * len(cols)]
    prev = None
    for r in results.iter_rows(named=True):
        cells = []
        for c in cols:
            v = r[c]
            if c == "method":
                cells.append("" if v == prev else str(v))
            elif isinstance(v, float):
                se = r.get(f"{c}_se")
                ci = f" ± {1.96 * se:.3f}" if isinstance(se, float) and math.isfinite(se) else ""
                cells.append("—" if v != v else f"{v:.3f}{ci}")
            else:
                cells.append("—" if v is None else str(v))
        prev = r["method"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_results(results: pl.DataFrame, path: str | os.PathLike, n_prompts: int | None = None) -> None:
    """Each metric against K (plain integer labels), one line per method, with 95% intervals over
    the ``n_prompts`` evaluation prompts (mean +- 1.96 standard errors; the base model as a dashed
    line and a band). Methods are drawn side by side around each K so that equal values stay
    visible; a cell that shares its kept rows (and so its model) with another is drawn hollow and
    labelled with that cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker as mticker

    metrics = [m for m in RESULT_METRICS if m in results.columns and results[m].drop_nulls().len()]
    methods = [m for m in results["method"].unique(maintain_order=True).to_list() if m != "base"]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.2), squeeze=False)
    for ax, met in zip(axes[0], metrics):
        se_col = f"{met}_se"
        for i, method in enumerate(["base"] + methods):
            sub = results.filter(pl.col("method") == method).sort("K")
            if sub.height == 0:
                continue
            se = [(1.96 * v if v is not None and math.isfinite(v) else 0.0) for v in
                  (sub[se_col].to_list() if se_col in sub.columns else [None] * sub.height)]
            vals = sub[met].to_list()
            if method == "base":
                if vals[0] is not None:
                    ax.axhline(vals[0], ls="--", color="grey", label="base")
                    if se[0]:
                        ax.axhspan(vals[0] - se[0], vals[0] + se[0], color="grey", alpha=0.12)
                continue
            shift = 2.0 ** (0.05 * (i - 1 - (len(methods) - 1) / 2))  # side by side on the log-K axis
            x = [k * shift for k in sub["K"].to_list()]
            bars = ax.errorbar(x, vals, yerr=se, marker="o", capsize=3, label=method)
            if "same_as" in sub.columns:
                for xi, v, twin in zip(x, vals, sub["same_as"].to_list()):
                    if twin is not None and v is not None:
                        ax.plot([xi], [v], "o", mfc="white", mec=bars[0].get_color())
                        ax.annotate(f"= {twin}", (xi, v), fontsize=6, xytext=(3, 3), textcoords="offset points")
        if "k_star" in results.columns:  # the advisor's K* and its bootstrap interval
            r = results.row(0, named=True)
            if r["k_star"] is not None and math.isfinite(r["k_star"]):
                ax.axvline(r["k_star"], color="C3", ls=":", label=f"K* = {r['k_star']:.2f}")
            lo, hi = r["k_star_lo"], r["k_star_hi"]
            if lo is not None and math.isfinite(lo):
                ax.axvspan(max(lo, 0.5), hi if math.isfinite(hi) else ax.get_xlim()[1], color="C3", alpha=0.1)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(mticker.LogLocator(base=2))
        ax.xaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:.0f}" if v >= 1 else f"{v:g}"))
        ax.xaxis.set_minor_formatter(mticker.NullFormatter())
        ax.set_xlabel("K")
        ax.set_title(f"{met} (95% interval over prompts)", fontsize=9)
    axes[0][0].legend(fontsize=8)
    title = [] if n_prompts is None else [f"{n_prompts} evaluation prompts"]
    if "k_star" in results.columns and results["k_star"][0] is not None:
        r = results.row(0, named=True)
        title.append(f"V_x = {r['v_x']:.3g}, V_y|x = {r['v_y_given_x']:.3g}, K* = {r['k_star']:.3g} "
                     f"[{r['k_star_lo']:.3g}, {r['k_star_hi']:.3g}], trained K = "
                     f"{sorted(set(results.filter(pl.col('method') != 'base')['K'].to_list()))}")
    if title:
        fig.suptitle("; ".join(title), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
