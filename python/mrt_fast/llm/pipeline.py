"""The whole LLM experiment from one YAML file: generate -> embed -> score -> [diagnose] -> select -> train -> evaluate.

Every stage writes its output under ``out_dir`` and is skipped when that output
already exists, so a run that stopped resumes where it stopped and a grid can
be extended (add a method or a K, run again: only the new cells train). Embed,
score, the diagnose stage's pilot losses and select run as stages of the dataset
job (`mrt_fast.llm.run_stages`), on either engine; embed, score and the pilot
losses resume from their finished parts.

Layout of ``out_dir``::

    candidates.parquet (+ .parts/)   overgenerated candidates (resumable)
    embedded.parquet (+ .parts/)     + embedding column (resumable by parts)
    scored.parquet (+ .parts/)       + reward column (reward model or reward hook), + mode (stratified)
    diagnose/                        select.ks: auto: losses.parquet, report.json, variance.png
    select/<method>_k<K>.parquet     kept rows per cell
    runs/<method>_k<K>/              adapter/, train_log.jsonl, metrics.json, samples.parquet
    results.csv / results.md / results.png

The config is `mrt_fast.llm.run_config`, the records of each output's settings
`mrt_fast.llm.stage_plan` and `mrt_fast.llm.stage_records`, the results table
and plot `mrt_fast.llm.run_results`. See docs/guides/pipeline.md for the config reference.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import polars as pl

from mrt_fast.answers.run_config import answer_columns
from mrt_fast.datasets.formats import read_table, write_table
from mrt_fast.embeddings.embedders import make_embedder
from mrt_fast.errors import MrtInputError
from mrt_fast.llm import stage_records as sr
from mrt_fast.llm.cells import cell_name, cells_on_disk, kept_key
from mrt_fast.llm.models import set_threads
from mrt_fast.llm.run_config import SELECT_OWN, STAGES, RunConfig, apply_overrides, check_inputs, parse_ks
from mrt_fast.llm.run_dir import check_out_dir
from mrt_fast.llm.run_results import RESULT_METRICS, plot_results, results_markdown, results_row
from mrt_fast.llm.run_stages import ROWS_PER_PART, embed_step, score_step, select_step
from mrt_fast.llm.stage_plan import StagePlan
from mrt_fast.tables.arrays import require_columns

__all__ = ["RESULT_METRICS", "STAGES", "RunConfig", "StagePlan", "apply_overrides", "check_inputs", "plot_results",
           "results_markdown", "results_row", "run"]


def _log(msg: str, progress: bool) -> None:
    if progress:
        from rich.markup import escape

        from mrt_fast._util.messages import rich_console

        rich_console(stderr=True).print(f"[bold cyan]mrt run[/] {escape(msg)}")



def run(config: RunConfig | dict | str | os.PathLike, *, embedder=None, reward_fn=None, progress: bool = True,
        stages: tuple[str, ...] = STAGES, redo_changed: bool = False, engine: str = "local",
        rows_per_part: int = ROWS_PER_PART) -> pl.DataFrame:
    """Run the experiment grid; returns the results table (one row per method x K).

    ``reward_fn``: a reward hook (a callable over the candidate rows, see
    `mrt_fast.llm.reward.load_reward_fn`) overriding the config's ``reward_fn``.
    An output already in ``out_dir`` is reused only when it was made with the
    current settings (`mrt_fast.llm.stage_records`); one made with other
    settings is refused before any work, or with ``redo_changed`` deleted with
    everything made from it, and made again.

    ``engine``: where the embed, score, pilot-loss and select stages run, ``"local"`` (this
    machine) or ``"ray"`` (a Ray cluster: the current one, or a new local instance), with the
    same outputs; ``rows_per_part``: candidates of a part of the embed, score and pilot-loss
    jobs (a stopped run resumes from the finished parts).
    """
    from mrt_fast.llm.evaluate import EvalConfig, evaluate
    from mrt_fast.llm.generate import GenerationConfig, generate
    from mrt_fast.datasets.executors import executor
    from mrt_fast.llm.reward import load_reward_fn
    from mrt_fast.selection.options import METHODS
    from mrt_fast.llm.train import TrainConfig, train

    if isinstance(config, (str, os.PathLike)):
        config = RunConfig.from_yaml(config)
    elif isinstance(config, dict):
        config = RunConfig.from_dict(config)
    cfg = config
    set_threads(cfg.threads)
    executor(engine)
    if isinstance(rows_per_part, bool) or not isinstance(rows_per_part, int) or rows_per_part < 1:
        raise MrtInputError(f"rows_per_part must be an integer >= 1, got {rows_per_part!r}")
    bad = [s for s in stages if s not in STAGES]
    if bad:
        raise MrtInputError(f"unknown stage(s) {bad}; stages are {STAGES}")
    methods = [str(m) for m in cfg.select.get("methods", ["random"])]
    for m in methods:
        if m.lower() not in METHODS:
            raise MrtInputError(f"unknown selection method {m!r}; known: {sorted(METHODS)}")
    ks = parse_ks(cfg.select.get("ks", [1, 2, 4]))
    from mrt_fast.llm.advisor import AUTO_KEYS, auto_settings

    auto = auto_settings(cfg.select) if ks == "auto" else None
    sel_kw = {k: v for k, v in cfg.select.items() if k not in SELECT_OWN and k not in AUTO_KEYS}
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
        embed_step(cand, embedded, spec=cfg.embedder, embedder=embedder, loader=get_embedder,
                   embedder_id=plan.embedder_id, engine=engine, rows_per_part=rows_per_part, progress=progress)
    # 3. score (and modes when stratified is asked)
    scored = out / "scored.parquet"
    if not scored.exists():
        records.set("score", plan.expected("score"))
        if cfg.reward_model:
            _log(f"score with {cfg.reward_model}", progress)
        elif reward_hook is not None:
            _log(f"score with reward_fn {rfn if isinstance(rfn, str) else getattr(rfn, '__name__', 'hook')}",
                 progress)
        then = None
        if cfg.answers is not None:  # the answer is the mode, the checker's verdict the reward

            def then(df: pl.DataFrame) -> pl.DataFrame:
                _log(f"answers: extract {cfg.answers.get('extract', 'last_number')}", progress)
                df = answer_columns(df, cfg.answers, read_table(cfg.train_prompts))
                if "mode" in df.columns:
                    records.set("modes", plan.expected("modes"))
                return df

        score_step(embedded, scored, reward_model=cfg.reward_model, hook=reward_hook, hook_spec=rfn,
                   hook_id=plan.hook_id, prompts=cfg.train_prompts, embedder_spec=cfg.embedder, device=cfg.device,
                   then=then, engine=engine, rows_per_part=rows_per_part, progress=progress)
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
                          warm_data=warm_data, warm_steps=auto["warm_steps"], engine=engine,
                          rows_per_part=rows_per_part)
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
                select_step(scored, sel_f, k, canon, sel_kw, engine=engine)
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

