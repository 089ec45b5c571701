"""What each output of an ``mrt run`` out_dir would be recorded with under the current settings,
and the check of the outputs already there (`mrt_fast.llm.stage_records` holds the records,
their comparison and the deletion of what a changed stage invalidates)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import polars as pl

from mrt_fast.datasets.formats import write_table
from mrt_fast.llm import stage_records as sr
from mrt_fast.llm.cells import kept_key, parse_cell
from mrt_fast.llm.run_config import RunConfig

__all__ = ["StagePlan"]


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
            if (out / f).exists() or (out / f"{f}.parts").exists():  # finished, or some of its parts
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

