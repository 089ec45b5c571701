"""K from the variance advisor, for the pipeline (`select.ks: auto`, `mrt run --k auto`).

Before anything trains, the base model's per-response losses l_ij
(`mrt_fast.llm.loss`, the loss training minimises) are measured on a validation
pool of prompts with several candidates each; `variance_budget` turns them
into V_x, V_y|x and the budget law's K* for the configured costs C_p, C_r, and
the pipeline trains at the recommended integer K (and, with
``neighbours: true``, at K - 1 and K + 1 to show the U).

With ``warm_pilot`` (`mrt_fast.llm.warm_pilot`) the losses are scored from a
warm state instead of the base model as it is: ``chat`` (the chat template) or
``lora`` (a short LoRA warm-up on prompts the pilot does not score); the
advice names the warm state (``warm_pilot``: its tag).

Files under ``out_dir/diagnose/``: ``losses.parquet`` (prompt_id, loss),
``warm.json`` (the warm state the losses were scored in), ``report.json`` (the
full `VarianceReport` plus the advice), ``variance.png``. A rerun reuses the
losses; changed costs or budget only redo the report.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import polars as pl

from mrt_fast.errors import MrtInputError
from mrt_fast.datasets.formats import read_table, write_table
from mrt_fast.tables.arrays import require_columns

#: keys of the `select` config section that belong to the advisor
AUTO_KEYS = ("cost_prompt", "cost_response", "budget", "neighbours", "n_boot", "validation_prompts", "warm_pilot",
             "warm_steps", "warm_data")


def auto_settings(sel: dict) -> dict:
    """The advisor's settings from the `select` config section, checked (one error naming what is wrong)."""
    missing = [k for k in ("cost_prompt", "cost_response") if sel.get(k) is None]
    if missing:
        raise MrtInputError(f"select.ks: auto needs the costs of a prompt and of a response: set select.{missing[0]} "
                            "(C_p, C_r of the budget law; only their ratio sets K*)")
    out = {}
    for k in ("cost_prompt", "cost_response", "budget"):
        v = sel.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise MrtInputError(f"select.{k} must be a positive number, got {v!r}")
        out[k] = float(v)
    out["neighbours"] = bool(sel.get("neighbours", False))
    out["n_boot"] = int(sel.get("n_boot", 1000))
    vp = sel.get("validation_prompts")
    if vp is not None and (isinstance(vp, bool) or not isinstance(vp, int) or vp < 2):
        raise MrtInputError(f"select.validation_prompts must be an integer >= 2, got {vp!r}")
    out["validation_prompts"] = vp
    from mrt_fast.llm.warm_pilot import WARM_PILOTS

    wp = sel.get("warm_pilot", "none")
    if wp not in WARM_PILOTS:
        raise MrtInputError(f"select.warm_pilot must be one of {', '.join(WARM_PILOTS)}, got {wp!r}")
    ws = sel.get("warm_steps", 16)
    if isinstance(ws, bool) or not isinstance(ws, int) or ws < 1:
        raise MrtInputError(f"select.warm_steps must be an integer >= 1, got {ws!r}")
    wd = sel.get("warm_data")
    if wd is not None and wp != "lora":
        raise MrtInputError("select.warm_data is the warm-up data of select.warm_pilot: lora")
    out.update(warm_pilot=wp, warm_steps=ws, warm_data=wd)
    return out


def warm_up_rows(pool: pl.DataFrame, pairs: pl.DataFrame) -> pl.DataFrame:
    """The default warm-up data of ``warm_pilot: lora``: the pool's rows whose prompts the pilot does not score."""
    scored = pairs["prompt"].unique().implode()
    rest = pool.select("prompt_id", "prompt", pl.col("response").fill_null("")).filter(
        ~pl.col("prompt").is_in(scored))
    if rest.height == 0:
        raise MrtInputError("select.warm_pilot: lora warms up on prompts the pilot does not score, and every prompt "
                            "of the pool is scored: set select.warm_data, or select.validation_prompts below the "
                            "number of prompts")
    return rest


def validation_pairs(table: Any, limit: int | None = None) -> pl.DataFrame:
    """prompt_id, prompt, response of the validation pool; every prompt needs two candidates or more."""
    df = read_table(table) if isinstance(table, (str, Path)) else table
    require_columns(df, ["prompt_id", "prompt", "response"], "validation pool")
    df = df.select("prompt_id", "prompt", pl.col("response").fill_null(""))
    if limit is not None:
        keep = df["prompt_id"].unique(maintain_order=True).head(limit)
        df = df.filter(pl.col("prompt_id").is_in(keep.implode()))
    counts = df.group_by("prompt_id", maintain_order=True).len()
    if counts.height < 2:
        raise MrtInputError(f"the validation pool has {counts.height} prompt(s); V_x needs at least 2")
    one = counts.filter(pl.col("len") < 2)
    if one.height:
        p = one["prompt_id"][0]
        raise MrtInputError(f"the validation pool has {one.height} prompt(s) with a single candidate (first: "
                            f"prompt_id={p!r}); V_y|x needs several responses per prompt", pool=p)
    return df


def diagnose(pairs: pl.DataFrame, model: Any, out_dir: str | Path, *, cost_prompt: float, cost_response: float,
             budget: float | None = None, k_max: int = 1024, n_boot: int = 1000, seed: int = 0,
             max_length: int | None = 1024, prompt_format: str = "auto", device: str = "auto",
             dtype: str = "float32", batch_size: int = 8, progress: bool = True, warm_pilot: str = "none",
             warm_data: Any = None, warm_steps: int = 16, engine: str = "local",
             rows_per_part: int = 50_000) -> dict:
    """Measure the model's losses on ``pairs`` and return the advice (cached in out_dir/report.json).

    The losses are the nll job's (`mrt_fast.llm.run_stages.nll_step`, as ``mrt nll``: resumable by
    parts of ``rows_per_part`` pairs, on ``engine``), truncated to ``max_length``. ``warm_pilot``:
    ``none`` scores with the base model as it is, in ``prompt_format``; ``chat`` or ``lora`` score
    from that warm state (`mrt_fast.llm.warm_pilot.warm_up`: ``lora`` trains ``warm_steps`` steps on
    ``warm_data``, whose prompts must not be among the scored ones, into ``out_dir/warm/``, and its
    losses are scored on the local engine)."""
    out = Path(out_dir)
    report_f = out / "report.json"
    settings = {"cost_prompt": cost_prompt, "cost_response": cost_response, "budget": budget, "k_max": k_max,
                "n_boot": n_boot}
    if report_f.exists():  # the losses do not depend on the costs: a changed setting only redoes the report
        advice = json.loads(report_f.read_text())["advice"]
        if all(advice.get(k) == v for k, v in settings.items()):
            return advice
    from mrt_fast._util.device import resolve_device
    from mrt_fast.llm.run_stages import nll_step
    from mrt_fast.variance.budget import variance_budget

    out.mkdir(parents=True, exist_ok=True)
    losses_f = out / "losses.parquet"
    warm_f = out / "warm.json"
    if losses_f.exists():
        warm = json.loads(warm_f.read_text()) if warm_f.exists() else {"mode": "none", "tag": "none"}
    else:
        dev = resolve_device(device)
        state = _warm_state(out, model, warm_pilot, pairs, warm_data, warm_steps, prompt_format, dev)
        warm = {"mode": state.mode, "tag": state.tag, "prompt_format": state.prompt_format,
                "warm_prompts": state.warm_prompts, "adapter": None if state.adapter is None else str(state.adapter)}
        warm_f.write_text(json.dumps(warm, indent=2))
        pairs_f = out / "pairs.parquet"
        if not pairs_f.exists():  # a stopped run resumes the job of the same pairs
            write_table(pairs.select("prompt_id", "prompt", "response"), pairs_f)
        # a LoRA adapter is a local folder: its losses are scored on this machine
        nll_step(pairs_f, losses_f, model=model, adapter=state.adapter, prompt_format=state.prompt_format,
                 max_length=max_length, device=dev, dtype=dtype, batch_size=batch_size,
                 engine="local" if state.adapter is not None else engine, rows_per_part=rows_per_part,
                 progress=progress)
        pairs_f.unlink()
    losses = pl.read_parquet(losses_f)
    rep = variance_budget(losses, cost_prompt=cost_prompt, cost_response=cost_response, budget=budget,
                          k_max=k_max, n_boot=n_boot, seed=seed)
    rep.plot(out / "variance.png")
    ci = rep.ci
    # an unidentified ratio (V_x not told from 0) gives no K*: train at the K the interval supports
    advice = {
        "v_x": rep.v_x, "v_y_given_x": rep.v_y_given_x, "ratio": rep.ratio,
        "identified": rep.identified,
        "k_star": rep.k_star, "k_star_ci": list(ci.get("k_star", (math.nan, math.nan))),
        "k_best": rep.k_best if rep.identified else rep.k_at_least,
        "k_best_ci": list(ci.get("k_best", (math.nan, math.nan))),
        "ci_level": rep.ci_level, "n_prompts": rep.n_prompts, "n_pairs": rep.n_rows,
        "warm_pilot": warm["tag"], **settings, "notes": list(rep.notes),
    }
    d = rep.to_dict()
    report_f.write_text(json.dumps({"report": d, "advice": _jsonable(advice)}, indent=2))
    return json.loads(report_f.read_text())["advice"]


def _warm_state(out: Path, model: Any, mode: str, pairs: pl.DataFrame, warm_data: Any, steps: int,
                prompt_format: str, device: str):
    """The pilot's warm state (`mrt_fast.llm.warm_pilot.WarmPilot`); a ``lora`` adapter already trained
    into ``out/warm/`` for the same warm-up (its tag in ``out/warm.json``) is reused, so a stopped
    job resumes scoring with the adapter it started with."""
    from mrt_fast.llm.warm_pilot import WarmPilot, warm_up, warm_up_tag

    warm_f = out / "warm.json"
    if mode == "lora" and warm_f.exists():
        old = json.loads(warm_f.read_text())
        adapter = old.get("adapter")
        if old.get("mode") == "lora" and adapter and Path(adapter).is_dir() and \
                old.get("tag") == warm_up_tag(warm_data, steps):
            return WarmPilot("lora", old["prompt_format"], Path(adapter), old["tag"], int(old.get("warm_prompts", 0)))
    return warm_up(model, mode, scored_prompts=pairs["prompt"].unique().to_list(), warm_data=warm_data,
                   steps=steps, prompt_format=prompt_format, work_dir=out / "warm", device=device)


def _jsonable(d: dict) -> dict:
    from mrt_fast.variance.report import json_num

    return {k: ([json_num(x) for x in v] if isinstance(v, list) and k != "notes" else json_num(v))
            for k, v in d.items()}


def ks_to_train(advice: dict, neighbours: bool, k_cap: int) -> list[int]:
    """The recommended integer K (capped by the candidates per prompt), with K - 1 and K + 1 when asked."""
    k = min(int(advice["k_best"]), int(k_cap))
    ks = [k - 1, k, k + 1] if neighbours else [k]
    return sorted({x for x in ks if 1 <= x <= k_cap})


def as_float(v: Any) -> float:
    """A number from the advice's JSON (``"inf"`` strings and None included)."""
    if v is None:
        return math.nan
    return float(v)
