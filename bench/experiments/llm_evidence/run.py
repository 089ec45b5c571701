"""The variance-budget law on SmolLM2-135M: predict K from a pilot, then fine-tune and measure.

    python bench/experiments/llm_evidence/run.py            # the full grid (resumable, cell by cell)
    python bench/experiments/llm_evidence/run.py --quick    # a miniature: a few steps, one seed, tiny sizes

Every cell's result is written atomically to ``RESULTS/<cell>.json``; a rerun
skips the cells already written with the same settings. Cells:

* ``pilot-<task>``: the base model's per-response losses on the training
  prompts' candidate pools (`mrt_fast.llm.nll.nll_table`) and
  `mrt_fast.variance_budget` on them: V_x, V_y|x, their ratio, K* with intervals.
* ``base-<task>``: the base model on the held-out prompts (no training).
* ``matched-<task>-k<K>-s<seed>``: random-K on all training prompts, a fixed
  number of optimizer steps for every K (the paper's design).
* ``budget-<task>-k<K>-s<seed>``: random-K on N_p(K) = floor(B / (C_p + K C_r))
  prompts, the same steps (the law's design; K = 1 is the matched K = 1 cell).
* ``select-<method>-k<K>-s<seed>``: the selectors on the high-variance task
  (random is the matched cell of that K).

Each training cell runs `mrt_fast.select` -> `mrt_fast.llm.train.train` ->
held-out evaluation (per-reference losses with the training loss, and
`mrt_fast.llm.evaluate.evaluate` for coverage and diversity of samples).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from llm_evidence.cell_files import write_atomic  # noqa: E402
from llm_evidence.smollm2 import MODEL_DIR, model_path  # noqa: E402
from llm_evidence.tasks import FAMILIES, build_task, split_task  # noqa: E402

TASKS = list(FAMILIES)  # product (low V_y|x), multiple (in between), expression (high V_y|x)
HIGH = "expression"
#: the kernel of the diverse and GRADES cells: (1 + c)/2, the paper's code (the library's default is "clip")
KERNEL = "shift"

FULL = dict(n_train=48, n_heldout=24, pool_size=8, n_refs=4, ks=[1, 2, 4, 8], seeds=[0, 1, 2], steps=32,
            batch_size=8, lr=1e-3, lora_r=8, cost_prompt=10.0, cost_response=1.0, select_k=4,
            methods=["top", "diverse", "grades"], n_samples=4, max_new_tokens=16, n_boot=1000,
            prompt_format="plain", tasks=TASKS)
QUICK = dict(FULL, n_train=6, n_heldout=3, ks=[1, 2], seeds=[0], steps=2, select_k=2, methods=["grades"],
             n_samples=2, max_new_tokens=6, n_boot=200, tasks=["product", HIGH])


def budget_prompts(cfg: dict, k: int) -> int:
    """N_p(K) at the budget that buys every training prompt at K = 1."""
    b = cfg["n_train"] * (cfg["cost_prompt"] + cfg["cost_response"])
    return min(cfg["n_train"], int(b // (cfg["cost_prompt"] + k * cfg["cost_response"])))


def cells(cfg: dict) -> list[tuple[str, dict]]:
    """Every cell in run order: pilots and base models first, then seed by seed so that a partial run is balanced."""
    tasks = cfg["tasks"]
    out = [(f"pilot-{t}", {"kind": "pilot", "task": t}) for t in tasks]
    out += [(f"base-{t}", {"kind": "base", "task": t}) for t in tasks]
    for s in cfg["seeds"]:
        for t in tasks:
            for k in cfg["ks"]:
                out.append((f"matched-{t}-k{k}-s{s}", {"kind": "train", "task": t, "k": k, "seed": s,
                                                      "n_prompts": cfg["n_train"], "method": "random"}))
        for t in tasks:
            for k in cfg["ks"]:
                if k > 1:
                    out.append((f"budget-{t}-k{k}-s{s}", {"kind": "train", "task": t, "k": k, "seed": s,
                                                         "n_prompts": budget_prompts(cfg, k), "method": "random"}))
        for m in cfg["methods"]:
            out.append((f"select-{m}-k{cfg['select_k']}-s{s}", {"kind": "train", "task": HIGH, "k": cfg["select_k"],
                                                               "seed": s, "n_prompts": cfg["n_train"], "method": m}))
    return out


def kept_rows(split, spec: dict, results: Path):
    """The training rows of a cell: its prompts' candidates, selected by the cell's method (the selectors read
    reward = -pilot loss from ``results`` and hashing embeddings of the responses)."""
    import numpy as np
    import polars as pl

    import mrt_fast
    from mrt_fast.embeddings.embedders import HashingEmbedder

    cands = split.candidates(split.train[: spec["n_prompts"]])
    if spec["method"] != "random":
        pilot = json.loads((results / f"pilot-{spec['task']}.json").read_text())["result"]["losses"]
        loss = pl.DataFrame(pilot).select("prompt_id", "candidate_index", (-pl.col("loss")).alias("reward"))
        cands = cands.join(loss, on=["prompt_id", "candidate_index"], how="left", maintain_order="left")
        emb = np.asarray(HashingEmbedder()(cands["response"].to_list()), dtype=np.float32)
        cands = cands.with_columns(pl.Series("embedding", list(emb)))
    with warnings.catch_warnings():  # pools smaller than K are kept whole (product: 4 answers)
        warnings.simplefilter("ignore", mrt_fast.SmallPoolWarning)
        kept = mrt_fast.select(cands, spec["k"], spec["method"], seed=spec["seed"], kernel=KERNEL)
    return kept.select("prompt_id", "prompt", "response")


class Runner:
    def __init__(self, cfg: dict, results: Path, model_dir: Path, work: Path, device: str = "cpu"):
        self.cfg, self.results, self.work, self.device = cfg, results, work, device
        self.model = model_path(None, model_dir)
        self.splits = {t: split_task(build_task(t, cfg["n_train"] + cfg["n_heldout"]), cfg["n_train"],
                                     cfg["n_heldout"], cfg["pool_size"], cfg["n_refs"]) for t in cfg["tasks"]}
        self._tok = None

    @property
    def tok(self):
        if self._tok is None:
            from mrt_fast.llm.models import load_tokenizer

            self._tok = load_tokenizer(self.model)
        return self._tok

    # ---------------------------------------------------------------- cells

    def pilot(self, task: str) -> dict:
        import mrt_fast
        from mrt_fast.llm.models import load_causal_lm
        from mrt_fast.llm.nll import nll_table

        cfg, sp = self.cfg, self.splits[task]
        net = load_causal_lm(self.model, device=self.device)
        t0 = time.time()
        table = nll_table(sp.candidates(), net, self.tok, prompt_format=cfg["prompt_format"], progress=False)
        rep = mrt_fast.variance_budget(table, cost_prompt=cfg["cost_prompt"], cost_response=cfg["cost_response"],
                                       k_grid=cfg["ks"], n_boot=cfg["n_boot"], seed=0,
                                       budget=cfg["n_train"] * (cfg["cost_prompt"] + cfg["cost_response"]))
        return {"report": rep.to_dict(), "seconds": time.time() - t0,
                "losses": table.select("prompt_id", "candidate_index", "loss").to_dicts()}

    def evaluate(self, task: str, adapter: str | None) -> dict:
        from mrt_fast.embeddings.embedders import HashingEmbedder
        from mrt_fast.llm.evaluate import evaluate
        from mrt_fast.llm.loss import pair_losses
        from mrt_fast.llm.models import load_causal_lm

        cfg, sp = self.cfg, self.splits[task]
        net = load_causal_lm(self.model, device=self.device, adapter=adapter)
        refs = sp.references()
        fp = [p for p, rs in zip(refs["prompt"], refs["reference"]) for _ in rs]
        fr = [r for rs in refs["reference"] for r in rs]
        per, ns = pair_losses(net, self.tok, fp, fr, prompt_format=cfg["prompt_format"], device=self.device,
                              progress=False, sort_by_length=False, return_counts=True)
        with tempfile.TemporaryDirectory() as d:
            m = evaluate(refs, net, tokenizer=self.tok, embedder=HashingEmbedder(), n_samples=cfg["n_samples"],
                         max_new_tokens=cfg["max_new_tokens"], prompt_format=cfg["prompt_format"], device=self.device,
                         progress=False, samples_out=f"{d}/s.parquet")
            import polars as pl

            samples = pl.read_parquet(f"{d}/s.parquet")
        checks = {p.prompt_id: p.check for p in sp.heldout}
        valid, distinct = [], []
        for pid, grp in samples.group_by("prompt_id", maintain_order=True):
            rs = [r.strip() for r in grp["response"].to_list()]
            ok = [checks[pid[0]](r) for r in rs]
            valid.append(sum(ok) / len(rs))
            distinct.append(len({r for r, o in zip(rs, ok) if o}) / len(rs))
        n_ref = len(fr) // refs.height  # references per held-out prompt (the same for every prompt of a task)
        return {"ref_loss": float((per * ns).sum() / ns.sum()), "ref_loss_evaluate": m["ref_loss"],
                "per_reference": per.tolist(), "ref_tokens": ns.tolist(), "n_refs_per_prompt": n_ref,
                "coverage": m["coverage"], "diversity": m["diversity"],
                "valid_rate": sum(valid) / len(valid), "distinct_valid": sum(distinct) / len(distinct),
                "samples": samples["response"].to_list()}

    def train_cell(self, spec: dict) -> dict:
        from llm_evidence.lora_train import train_adapter

        cfg = self.cfg
        kept = kept_rows(self.splits[spec["task"]], spec, self.results)
        out = self.work / f"run-{os.getpid()}"
        shutil.rmtree(out, ignore_errors=True)
        res = train_adapter(kept, self.model, out, steps=cfg["steps"], batch_size=cfg["batch_size"], lr=cfg["lr"],
                            lora_r=cfg["lora_r"], seed=spec["seed"], prompt_format=cfg["prompt_format"],
                            device=self.device)
        ev = self.evaluate(spec["task"], str(res.adapter_dir))
        shutil.rmtree(out, ignore_errors=True)
        return {**ev, "n_pairs": res.n_pairs, "n_prompts": res.n_prompts, "epochs": res.epochs,
                "train_seconds": res.seconds, "train_loss": [r["loss"] for r in res.log],
                "kept": kept.to_dicts()}

    # ---------------------------------------------------------------- driver

    def run(self, only: str | None = None) -> dict:
        done, ran = 0, 0
        todo = cells(self.cfg)
        for name, spec in todo:
            if only and only not in name:
                continue
            path = self.results / f"{name}.json"
            if path.exists() and json.loads(path.read_text()).get("config") == self.cfg:
                done += 1
                continue
            t0 = time.time()
            if spec["kind"] == "pilot":
                result = self.pilot(spec["task"])
            elif spec["kind"] == "base":
                result = self.evaluate(spec["task"], None)
            else:
                result = self.train_cell(spec)
            write_atomic(path, {"cell": name, "spec": spec, "config": self.cfg, "seconds": time.time() - t0,
                                "device": self.device, "result": result})
            ran += 1
            print(f"{name}: {time.time() - t0:.1f} s", flush=True)
        return {"cells": len(todo), "skipped": done, "ran": ran}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a miniature grid (CI)")
    ap.add_argument("--results", type=Path, default=None, help="where the cell results go")
    ap.add_argument("--model-dir", type=Path, default=MODEL_DIR,
                    help="the trainable copy of the bundled model (made once)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default=None, help="run only the cells whose name contains this")
    ap.add_argument("--no-report", action="store_true")
    ap.add_argument("--device", default="cpu", help="where the model runs (cpu, cuda); the committed results: cpu")
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(a.threads)
    cfg = QUICK if a.quick else FULL
    results = a.results or HERE.parents[1] / "results" / ("llm_evidence_quick" if a.quick else "llm_evidence")
    with tempfile.TemporaryDirectory(prefix="llm_evidence_") as work:
        summary = Runner(cfg, results, a.model_dir, Path(work), a.device).run(a.only)
    print(json.dumps(summary), flush=True)
    if not a.no_report:
        from llm_evidence.report import report

        report(results, quick=a.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
