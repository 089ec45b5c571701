"""Pilot every task family and pre-register the predictions of the variance law before any training.

    python bench/experiments/llm_evidence/preregister.py                 # all pilots (resumable), then the predictions
    python bench/experiments/llm_evidence/preregister.py --predict-only  # the predictions from the pilots present
    python bench/experiments/llm_evidence/preregister.py --quick         # a miniature (CI)

Pilots (one JSON file each, written atomically to ``RESULTS/pilots/<family>-<pilot>.json``;
a rerun skips the files already written with the same settings):

* ``base``: the model as it is, prompts as plain text;
* ``chat``: the model as it is, prompts in its chat template (the training format);
* ``lora``: a short LoRA warm-up on the family's warm-up prompts (disjoint from the
  scored ones), then scored in the chat template.

Each scores the family's pilot prompts x a balanced pool of valid answers
(`families.Item.pool`) and runs `mrt_fast.variance_budget` on the losses
(C_p / C_r = 10). The predictions (`PREDICTIONS.md`, `predictions.json`) are
written by `predictions.write_predictions` from these files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from llm_evidence.cell_files import is_done, write_atomic  # noqa: E402
from llm_evidence.families import FAMILIES, pilot_prompts, warm_prompts  # noqa: E402
from llm_evidence.smollm2 import MODEL_DIR, model_path  # noqa: E402
#: the order families are piloted in: spread over the expected ratios first, so a partial run is useful
ORDER = ["pick2", "range40", "neighbour", "sum", "pick8", "range3", "letter", "mixture", "divisor", "range10",
         "pick4", "multiple", "product"]
FULL = dict(n_pilot=96, pool_size=8, n_warm=32, warm_pool=4, warm_steps=16, warm_lr=1e-3, cost_prompt=10.0,
            cost_response=1.0, k_grid=[1, 2, 4, 8], n_boot=1000, batch_prompts=8,
            families=ORDER, pilots=["base", "chat", "lora"])
QUICK = dict(FULL, n_pilot=6, pool_size=4, n_warm=4, warm_pool=2, warm_steps=2, n_boot=100,
             families=["pick2", "range10", "mixture"], pilots=["base", "chat", "lora"])
#: the prompt format each pilot scores in
FORMATS = {"base": "plain", "chat": "chat", "lora": "chat"}


def pilot_table(family: str, cfg: dict):
    """prompt_id, prompt, response, candidate_index: the pilot prompts x their balanced answer pools."""
    import polars as pl

    rows = [(it.prompt_id, it.prompt, r, j) for it in pilot_prompts(family, cfg["n_pilot"])
            for j, r in enumerate(it.pool(cfg["pool_size"]))]
    return pl.DataFrame(rows, schema=["prompt_id", "prompt", "response", "candidate_index"], orient="row")


def warm_table(family: str, cfg: dict):
    """The warm-up's training rows: the warm-up prompts (disjoint from the pilot's) x a small answer pool."""
    import polars as pl

    rows = [(it.prompt_id, it.prompt, r) for it in warm_prompts(family, cfg["n_warm"], cfg["n_pilot"])
            for r in it.pool(cfg["warm_pool"], seed=1)]
    return pl.DataFrame(rows, schema=["prompt_id", "prompt", "response"], orient="row")


def pilot_settings(cfg: dict, pilot: str) -> dict:
    """The settings a pilot file depends on (a file with other settings is redone)."""
    keys = ["n_pilot", "pool_size", "cost_prompt", "cost_response", "k_grid", "n_boot"]
    if pilot == "lora":
        keys += ["n_warm", "warm_pool", "warm_steps", "warm_lr"]
    return {"pilot": pilot, "format": FORMATS[pilot], **{k: cfg[k] for k in keys}}


def run_pilot(family: str, pilot: str, cfg: dict, model: str, device: str = "cpu") -> dict:
    """One pilot: the losses, the variance report and (lora) the warm-up's record."""
    import mrt_fast
    from mrt_fast.llm.warm_pilot import warm_pilot_table

    table = pilot_table(family, cfg)
    t0 = time.time()
    mode = {"base": "none", "chat": "chat", "lora": "lora"}[pilot]
    warm = warm_table(family, cfg) if pilot == "lora" else None
    scored, state = warm_pilot_table(table, model, mode, warm_data=warm, steps=cfg["warm_steps"],
                                     prompt_format=FORMATS[pilot], device=device, batch_size=cfg["batch_prompts"],
                                     learning_rate=cfg["warm_lr"])
    seconds = time.time() - t0
    rep = mrt_fast.variance_budget(scored, cost_prompt=cfg["cost_prompt"], cost_response=cfg["cost_response"],
                                   k_grid=cfg["k_grid"], n_boot=cfg["n_boot"], seed=0)
    out = {"report": rep.to_dict(), "seconds": seconds, "prompt_format": state.prompt_format, "warm": state.tag,
           "losses": scored.select("prompt_id", "candidate_index", "response", "loss").to_dicts()}
    if warm is not None:
        out["warm_prompt_ids"] = sorted(set(warm["prompt_id"].to_list()))
        out["warm_prompts"] = state.warm_prompts
    return out


def run_pilots(cfg: dict, results: Path, model: str, device: str = "cpu", only: str | None = None) -> dict:
    ran = skipped = 0
    # family by family the base and chat pilots, then every family's lora pilot (the slowest)
    todo = [(f, p) for f in cfg["families"] for p in cfg["pilots"] if p != "lora"]
    todo += [(f, "lora") for f in cfg["families"] if "lora" in cfg["pilots"]]
    for family, pilot in todo:
        if True:
            if only and only not in f"{family}-{pilot}":
                continue
            path = results / "pilots" / f"{family}-{pilot}.json"
            settings = pilot_settings(cfg, pilot)
            if is_done(path, "settings", settings):
                skipped += 1
                continue
            t0 = time.time()
            res = run_pilot(family, pilot, cfg, model, device)
            write_atomic(path, {"family": family, "pilot": pilot, "settings": settings, "device": device,
                                "control": FAMILIES[family].control, "seconds": time.time() - t0, "result": res})
            ran += 1
            rep = res["report"]
            print(f"{family}-{pilot}: {time.time() - t0:.1f} s; ratio {rep['ratio']}, "
                  f"identified {rep['identified']}", flush=True)
    return {"ran": ran, "skipped": skipped}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a miniature (CI): 3 families, 6 prompts, 2 warm-up steps")
    ap.add_argument("--results", type=Path, default=None, help="where pilots/ and the predictions go")
    ap.add_argument("--model", default=None, help="a local causal LM directory (default: the bundled SmolLM2-135M, "
                    "made into a checkpoint once under --model-dir)")
    ap.add_argument("--model-dir", type=Path, default=MODEL_DIR)
    ap.add_argument("--pilots", default=None, help="comma-separated subset of base,chat,lora")
    ap.add_argument("--only", default=None, help="run only the pilots whose <family>-<pilot> contains this")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--predict-only", action="store_true", help="write the predictions from the pilots present")
    ap.add_argument("--predictions", type=Path, default=None,
                    help="where PREDICTIONS.md and predictions.json go (default: next to this script; --quick: "
                         "the results directory)")
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cfg = dict(QUICK if a.quick else FULL)
    if a.pilots:
        cfg["pilots"] = [p for p in a.pilots.split(",") if p]
        bad = sorted(set(cfg["pilots"]) - set(FORMATS))
        if bad:
            ap.error(f"unknown pilot(s) {bad}; known: {sorted(FORMATS)}")
    results = a.results or HERE.parents[1] / "results" / ("llm_evidence_v2_quick" if a.quick else "llm_evidence_v2")
    if not a.predict_only:
        import torch

        torch.set_num_threads(a.threads)
        model = model_path(a.model, a.model_dir)
        print(json.dumps(run_pilots(cfg, results, model, a.device, a.only)), flush=True)
    from llm_evidence.predictions import write_predictions

    where = a.predictions or (results if a.quick else HERE)
    summary = write_predictions(results / "pilots", where, quick=a.quick)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
