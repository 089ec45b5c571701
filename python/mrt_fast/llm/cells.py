"""The cells of an ``mrt run`` grid on disk: their names, their kept rows, the ones earlier runs left.

A cell is a (method, K) pair (the base model is ``base``, K = 0); its files
are ``select/<name>.parquet`` (kept rows) and ``runs/<name>/`` (adapter,
metrics). Two cells that keep the same rows (the same prompt, response and
weight, in any order) have the same training objective: `kept_key` names that
content, so a run trains it once.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import polars as pl

#: the columns of the kept rows that training reads
TRAIN_COLUMNS = ("prompt_id", "prompt", "response")


def cell_name(method: str | None, k: int) -> str:
    return "base" if method is None else f"{method}_k{k}"


def parse_cell(name: str) -> tuple[str, int] | None:
    """(method, K) of a cell's name (``base`` is ("base", 0)); None for a name that is not a cell's."""
    if name == "base":
        return "base", 0
    method, sep, k = name.rpartition("_k")
    return (method, int(k)) if sep and method and k.isdigit() else None


def training_rows(kept: pl.DataFrame) -> pl.DataFrame:
    """What training reads of the kept rows: prompt_id, prompt, response and weight (1 when absent)."""
    w = pl.col("weight").cast(pl.Float64) if "weight" in kept.columns else pl.lit(1.0)
    return kept.select(*TRAIN_COLUMNS, w.alias("weight"))


def kept_key(kept: pl.DataFrame) -> str:
    """A digest of the training rows as a multiset (row order aside): equal keys, the same training data."""
    rows = training_rows(kept).with_columns(pl.col("prompt_id").cast(pl.Utf8))
    return hashlib.blake2b(rows.sort(rows.columns).write_ndjson().encode(), digest_size=16).hexdigest()


def cells_on_disk(out_dir: str | Path) -> dict[str, dict]:
    """Every cell of ``out_dir/runs`` with a metrics.json: name -> its metrics."""
    runs = Path(out_dir) / "runs"
    found = {}
    for f in sorted(runs.glob("*/metrics.json")) if runs.is_dir() else []:
        if parse_cell(f.parent.name) is not None:
            found[f.parent.name] = json.loads(f.read_text())
    return found
