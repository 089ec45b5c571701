"""Embedding throughput and what the static tier costs the selectors, in one run.

Throughput, on the same ``--n`` texts of mixed length (``embed_corpus.mixed_texts``):

* ``encode``: sentence-transformers ``SentenceTransformer.encode`` of the
  bundled all-MiniLM-L6-v2 (batch 64, normalised), the floor a user already has;
* ``mrt embed`` (MiniLM): the CLI on a Parquet file of the texts, cold
  embedding cache (reads, hashes, sorts by length, embeds, caches, writes);
* ``mrt embed --model static``: the same command with the static tier;
* ``static encode``: the static model alone on the list of texts;
* ``--processes`` 1 vs 2 for MiniLM on the first ``--n-processes`` texts.

The model is loaded (and the static model distilled, timed once) before any
timing. Quality: ``embed_quality`` on the bundled MOSAIC examples and two
larger sets built from text Python ships (``embed_corpus``).

    python bench/bench_embed.py              # 20,000 texts (tens of minutes on 2 cores)
    python bench/bench_embed.py --n 500 --n-processes 200 --out quick.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--n-processes", type=int, default=2_000, help="texts for the --processes comparison (0: skip)")
    ap.add_argument("--block", type=int, default=2_000, help="texts per alternating encode / mrt embed block")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cache-dir", default=None, help="where the static model is kept (default: the user cache)")
    ap.add_argument("--no-quality", action="store_true")
    ap.add_argument("--out", default=str(HERE / "results" / "embed_bench.json"))
    a = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

    import numpy as np
    import polars as pl
    import torch
    from typer.testing import CliRunner

    from embed_corpus import docstring_pools, mixed_texts, pydoc_pools
    from mrt_fast.cli import app
    from mrt_fast.demo import load_examples
    from mrt_fast.embed import embed_texts, load_model
    from mrt_fast.static_embed import load_static, static_path

    torch.set_num_threads(a.threads)
    runner = CliRunner()
    res: dict = {"n_texts": a.n, "machine": {"cpus": os.cpu_count(), "torch_threads": a.threads,
                 "platform": platform.platform(), "torch": torch.__version__, "load_avg_start": os.getloadavg()}}
    texts = mixed_texts(a.n)
    tok = load_static("static", a.cache_dir, progress=False)._tok
    lens = np.array([len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=True)])
    res["tokens_per_text"] = {"mean": float(lens.mean()), "p5": float(np.percentile(lens, 5)),
                              "p50": float(np.percentile(lens, 50)), "p95": float(np.percentile(lens, 95))}
    print(f"{a.n} texts, tokens/text mean {lens.mean():.0f} (p5 {res['tokens_per_text']['p5']:.0f}, "
          f"p95 {res['tokens_per_text']['p95']:.0f})", flush=True)

    # one-time costs
    import mrt_fast.static_embed as se

    spath = static_path("static", a.cache_dir)
    fresh = not spath.exists()
    se._LOADED.clear()
    t = time.perf_counter()
    sm = load_static("static", a.cache_dir, progress=False)
    res["static_model"] = {"seconds": time.perf_counter() - t, "distilled_now": fresh, "file_mb": spath.stat().st_size / 1e6,
                           "dim": sm.dim, "model_id": sm.model_id}
    t = time.perf_counter()
    m = load_model(None, "cpu")
    res["minilm_load_seconds"] = time.perf_counter() - t

    out_path = Path(a.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        res["machine"]["load_avg_end"] = os.getloadavg()
        out_path.write_text(json.dumps(res, indent=1) + "\n")

    tmp_root = tempfile.TemporaryDirectory()
    tmp = Path(tmp_root.name)

    def cli(model: str | None, rows, cache: str | None = None) -> tuple[float, Path]:
        """(seconds, output) of ``mrt embed`` on the given rows of the texts (cold text cache)."""
        k = len(os.listdir(tmp))
        inp = tmp / f"in-{k}.parquet"
        pl.DataFrame({"id": np.asarray(rows), "response": [texts[i] for i in rows]}).write_parquet(inp)
        args = ["embed", str(inp), str(tmp / f"out-{k}.parquet"), "--cache-dir", cache or str(tmp / f"cache-{k}"),
                "--device", "cpu"]
        if model:
            args += ["--model", model]
        t0 = time.perf_counter()
        r = runner.invoke(app, args, catch_exceptions=False)
        dt = time.perf_counter() - t0
        assert r.exit_code == 0, r.output
        return dt, tmp / f"out-{k}.parquet"

    # the static tier, all texts at once
    rates = {}
    res["texts_per_second"] = rates
    rates["mrt embed --model static"] = a.n / cli("static", range(a.n), str(spath.parent.parent))[0]
    t0 = time.perf_counter()
    sm.encode(texts)
    rates["static encode (library call)"] = a.n / (time.perf_counter() - t0)
    print(f"static: mrt embed {rates['mrt embed --model static']:.0f}, library {rates['static encode (library call)']:.0f}"
          " texts/s", flush=True)
    save()

    if not a.no_quality:
        from embed_quality import markdown, quality_rows

        rows = []
        sets = {"mosaic": load_examples().select("prompt_id", "response", "reward"), "pydoc": pydoc_pools(),
                "docstrings": docstring_pools()}
        for name, df in sets.items():
            df = df.sort("prompt_id", maintain_order=True)
            xr = embed_texts(df["response"].to_list(), None, cache_dir=False, device="cpu", progress=False)
            xf = sm.encode(df["response"].to_list())
            rows += quality_rows(name, df, xr, xf)
        res["quality"] = rows
        if sm.meta.get("train_texts"):
            # the fitting corpus and the evaluation sets share no text
            from mrt_fast.static_corpus import corpus_texts

            shown = {t for df in sets.values() for t in df["response"].to_list()}
            corpus = corpus_texts(sm.meta["train_texts"])
            digest = hashlib.sha256("\n".join(corpus).encode("utf-8", "surrogatepass")).hexdigest()
            res["fitting_corpus"] = {"texts": len(corpus), "same_as_model": digest == sm.meta["train_corpus_sha256"],
                                     "texts_also_in_evaluation_sets": len(shown & set(corpus))}
            print("fitting corpus:", res["fitting_corpus"], flush=True)
        big = [r for r in rows if r["dataset"] != "mosaic"]
        res["quality_summary"] = {
            "worst_coverage_gap": min(r["coverage_gap"] for r in rows),
            "worst_gap_by_selector": {s: min(r["coverage_gap"] for r in big if r["selector"] == s)
                                      for s in ("random", "top", "diverse", "grades", "stratified")},
            "same_ranking_everywhere": all(r["same_ranking"] for r in rows),
            "within_2pct_everywhere": all(r["coverage_gap"] >= -0.02 for r in rows),
        }
        print(markdown(rows), flush=True)
        save()

    # MiniLM: encode and mrt embed on the same blocks, alternating which goes first (load drifts on a shared machine)
    spent = {"encode": 0.0, "mrt": 0.0}
    done = 0
    diffs = []
    for b, s in enumerate(range(0, a.n, a.block)):
        rows_b = list(range(s, min(s + a.block, a.n)))
        for which in (("encode", "mrt") if b % 2 == 0 else ("mrt", "encode")):
            if which == "encode":
                t0 = time.perf_counter()
                x_st = m.encode([texts[i] for i in rows_b], batch_size=64, normalize_embeddings=True,
                                convert_to_numpy=True, show_progress_bar=False)
                spent["encode"] += time.perf_counter() - t0
            else:
                dt, out_b = cli(None, rows_b)
                spent["mrt"] += dt
                x_mrt = pl.read_parquet(out_b)["embedding"].to_numpy()
        diffs.append(float(np.abs(x_mrt - x_st).max()))
        done += len(rows_b)
        rates["encode (sentence-transformers, MiniLM)"] = done / spent["encode"]
        rates["mrt embed (MiniLM)"] = done / spent["mrt"]
        res["minilm_texts_done"] = done
        res["mrt_vs_encode_max_abs_diff"] = max(diffs)
        floor = rates["encode (sentence-transformers, MiniLM)"]
        res["ratio_to_encode"] = {k: v / floor for k, v in rates.items()}
        res["targets"] = {
            "mrt embed MiniLM within 1.1x of encode": rates["mrt embed (MiniLM)"] >= floor / 1.1,
            "static >= 20x encode": rates["mrt embed --model static"] >= 20 * floor,
        }
        save()
        print(f"{done}/{a.n}: encode {floor:.1f}, mrt embed {rates['mrt embed (MiniLM)']:.1f} texts/s", flush=True)

    if a.n_processes:
        sub = texts[: a.n_processes]
        for p in (1, 2):
            t0 = time.perf_counter()
            embed_texts(sub, None, cache_dir=False, device="cpu", processes=p, progress=False)
            rates[f"MiniLM embed_texts, {p} process(es), first {a.n_processes} texts"] = a.n_processes / (
                time.perf_counter() - t0)
        print({k: round(v, 1) for k, v in rates.items() if "process" in k}, flush=True)
        floor = rates["encode (sentence-transformers, MiniLM)"]
        res["ratio_to_encode"] = {k: v / floor for k, v in rates.items()}
    tmp_root.cleanup()
    save()
    print(json.dumps({k: res[k] for k in ("texts_per_second", "ratio_to_encode", "targets")}, indent=1))
    print(f"results: {a.out}")


if __name__ == "__main__":
    main()
