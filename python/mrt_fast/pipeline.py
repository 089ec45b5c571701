"""The whole LLM experiment from one YAML file: generate -> embed -> score -> select -> train -> evaluate.

Every stage writes its output under ``out_dir`` and is skipped when that output
already exists, so a run that stopped resumes where it stopped and a grid can
be extended (add a method or a K, run again: only the new cells train).

Layout of ``out_dir``::

    candidates.parquet (+ .parts/)   overgenerated candidates (resumable)
    embedded.parquet                 + embedding column
    scored.parquet                   + reward column (when a reward model is set)
    select/<method>_k<K>.parquet     kept rows per cell
    runs/<method>_k<K>/              adapter/, train_log.jsonl, metrics.json, samples.parquet
    results.csv / results.md / results.png

See docs/readme_llm.md for the config reference.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ._llm import set_threads
from .embedders import make_embedder
from .io import read_table, require_columns, write_table
from .errors import MrtInputError

STAGES = ("generate", "embed", "score", "select", "train", "evaluate")
_TOP = {"out_dir", "model", "reward_model", "embedder", "data", "generate", "select", "train", "evaluate",
        "threads", "baseline", "device"}


@dataclass
class RunConfig:
    out_dir: str
    model: str
    train_prompts: str
    eval_data: str
    reward_model: str | None = None
    embedder: str = "minilm"  # minilm | hashing | a sentence-transformers path
    generate: dict = field(default_factory=dict)
    select: dict = field(default_factory=lambda: {"methods": ["random"], "ks": [1, 2, 4]})
    train: dict = field(default_factory=dict)
    evaluate: dict = field(default_factory=dict)
    threads: int | None = None
    baseline: bool = True  # also evaluate the base model (K = 0 row)
    device: str = "auto"

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> "RunConfig":
        import yaml

        path = Path(path)
        raw = yaml.safe_load(path.read_text()) or {}
        return cls.from_dict(raw, base=path.parent)

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
            embedder=raw.get("embedder", "minilm"),
            generate=raw.get("generate") or {},
            select=sel,
            train=raw.get("train") or {},
            evaluate=raw.get("evaluate") or {},
            threads=raw.get("threads"),
            baseline=bool(raw.get("baseline", True)),
            device=raw.get("device", "auto"),
        )


def _log(msg: str, progress: bool) -> None:
    if progress:
        from rich.console import Console

        Console(stderr=True).print(f"[bold cyan]mrt run[/] {msg}")


def run(config: RunConfig | dict | str | os.PathLike, *, embedder=None, progress: bool = True,
        stages: tuple[str, ...] = STAGES) -> pl.DataFrame:
    """Run the experiment grid; returns the results table (one row per method x K)."""
    from .evaluate import EvalConfig, evaluate
    from .generate import GenerationConfig, generate
    from .reward import score
    from .select import METHODS, select
    from .train import TrainConfig, train

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
    ks = [int(k) for k in cfg.select.get("ks", [1, 2, 4])]
    if any(k < 1 for k in ks):
        raise MrtInputError(f"every K must be >= 1, got {ks}")
    sel_kw = {k: v for k, v in cfg.select.items() if k not in ("methods", "ks")}
    tcfg = TrainConfig.from_dict({"device": cfg.device, **cfg.train})
    ecfg = EvalConfig.from_dict({"device": cfg.device, **cfg.evaluate})
    gcfg = GenerationConfig(**{"device": cfg.device, **cfg.generate})
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2, default=str))
    from ._llm import is_gguf, materialize_gguf

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

    # 1. generate
    cand = out / "candidates.parquet"
    if not cand.exists():
        if "generate" not in stages:
            raise MrtInputError(f"{cand} is missing and the generate stage is not run")
        _log(f"generate: n={gcfg.n} per prompt -> {cand}", progress)
        prompts = read_table(cfg.train_prompts)
        require_columns(prompts, ["prompt_id", "prompt"], "train prompts")
        generate(prompts.select("prompt_id", "prompt"), cand, model, gcfg, progress=progress)
    # 2. embed
    embedded = out / "embedded.parquet"
    if not embedded.exists():
        _log("embed candidates", progress)
        df = pl.read_parquet(cand)
        e = np.asarray(get_embedder()(df["response"].fill_null("").to_list()), dtype=np.float32)
        df = df.with_columns(pl.Series("embedding", e).cast(pl.Array(pl.Float32, e.shape[1])))
        write_table(df, embedded)
    # 3. score
    scored = out / "scored.parquet"
    if not scored.exists():
        df = pl.read_parquet(embedded)
        if cfg.reward_model:
            _log(f"score with {cfg.reward_model}", progress)
            df = score(df, cfg.reward_model, device=cfg.device, progress=progress)
        write_table(df, scored)
    pool = pl.read_parquet(scored)
    has_reward = "reward" in pool.columns
    # 4-6. select, train, evaluate each cell
    eval_df = read_table(cfg.eval_data)
    rows = []
    cells = [(None, 0)] if cfg.baseline else []
    cells += [(m, k) for m in methods for k in ks]
    for method, k in cells:
        name = "base" if method is None else f"{method}_k{k}"
        run_dir = out / "runs" / name
        metrics_f = run_dir / "metrics.json"
        adapter = None
        if method is not None:
            canon = METHODS[method.lower()]
            if canon in ("top", "grades") and not has_reward:
                raise MrtInputError(f"method {method!r} needs rewards: set reward_model in the config")
            sel_f = out / "select" / f"{name}.parquet"
            if not sel_f.exists():
                _log(f"select {name}", progress)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    kept = select(pool, k, canon, **sel_kw)
                write_table(kept, sel_f)
            adapter = run_dir / "adapter"
            if not (adapter / "adapter_config.json").exists():
                if "train" not in stages:
                    continue
                _log(f"train {name}: {tcfg.max_steps} optimizer steps", progress)
                kept = pl.read_parquet(sel_f)
                train(kept.select("prompt_id", "prompt", "response"), model, run_dir, tcfg, progress=progress)
        if not metrics_f.exists():
            if "evaluate" not in stages:
                continue
            _log(f"evaluate {name}", progress)
            t0 = time.time()
            m = evaluate(eval_df, model, adapter=adapter, config=ecfg, embedder=get_embedder(),
                         reward_model=cfg.reward_model, samples_out=run_dir / "samples.parquet", progress=progress)
            m["eval_seconds"] = time.time() - t0
            run_dir.mkdir(parents=True, exist_ok=True)
            metrics_f.write_text(json.dumps(m, indent=2))
        m = json.loads(metrics_f.read_text())
        rows.append({"method": method or "base", "K": k,
                     **{key: m.get(key) for key in ("ref_loss", "reward", "coverage", "diversity")},
                     **{key: v for key, v in m.items() if key.startswith("pass@")}})
    results = pl.DataFrame(rows) if rows else pl.DataFrame()
    if rows:
        write_table(results, out / "results.csv")
        (out / "results.md").write_text(results_markdown(results))
        plot_results(results, out / "results.png")
    return results


def results_markdown(results: pl.DataFrame) -> str:
    """The results as a markdown table in the shape of the paper's Table 4 (method shown once per block)."""
    cols = [c for c in results.columns]
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
                cells.append("—" if v != v else f"{v:.3f}")
            else:
                cells.append("—" if v is None else str(v))
        prev = r["method"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_results(results: pl.DataFrame, path: str | os.PathLike) -> None:
    """Each metric against K, one line per method (the base model as a dashed line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [m for m in ("ref_loss", "reward", "coverage", "diversity")
               if m in results.columns and results[m].drop_nulls().len()]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.2), squeeze=False)
    for ax, met in zip(axes[0], metrics):
        for method in results["method"].unique(maintain_order=True).to_list():
            sub = results.filter(pl.col("method") == method).sort("K")
            if method == "base":
                v = sub[met][0]
                if v is not None:
                    ax.axhline(v, ls="--", color="grey", label="base")
                continue
            ax.plot(sub["K"].to_list(), sub[met].to_list(), marker="o", label=method)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("K")
        ax.set_title(met)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
