"""Embedding throughput and what the static tier costs the selectors, in one run.

Throughput, on the same ``--n`` texts of mixed length (``embed_corpus.mixed_texts``):

* ``encode``: sentence-transformers ``SentenceTransformer.encode`` of the
  bundled all-MiniLM-L6-v2 (batch 64, normalised), the floor a user already has;
* ``mrt embed`` (MiniLM): the CLI on a Parquet file of the texts, cold
  embedding cache (reads, hashes, sorts by length, embeds, caches, writes);
* ``mrt embed --model static``: the same command with the static tier;
* ``static encode``: the static model alone on the list of texts;
* ``mrt embed --model int8`` and ``int8 encode``: MiniLM quantized to int8 on
  onnxruntime, through the CLI (cold cache) and alone;
* ``--processes`` 1 vs 2 for MiniLM on the first ``--n-processes`` texts.

The MiniLM, int8 and ``encode`` rows run on the same blocks of texts, in an
order that rotates from block to block, so a drift of the machine's speed
hits each alike. The models are loaded (the static model distilled and the
int8 model exported, each timed once) before any timing. Quality:
``mrt_fast.embeddings.quality`` for each fast tier, on the bundled MOSAIC examples and two
larger sets built from text Python ships (``embed_corpus``).

    python bench/perf/bench_embed.py              # 20,000 texts (tens of minutes on 2 cores)
    python bench/perf/bench_embed.py --n 500 --n-processes 200 --out quick.json
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
    ap.add_argument("--out", default=str(HERE.parent / "results" / "embed_bench.json"))
    a = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

    import numpy as np
    import polars as pl
    import torch
    from typer.testing import CliRunner

    from embed_corpus import docstring_pools, mixed_texts, pydoc_pools
    from mrt_fast.cli import app
    from mrt_fast.cli.demo import load_examples
    from mrt_fast.embeddings.embed import embed_texts, load_model
    from mrt_fast.embeddings.int8 import int8_path, load_int8
    from mrt_fast.embeddings.static import load_static, static_path

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

    # one-time costs: each tier's model file, built now if it is missing
    import mrt_fast.embeddings.int8 as ie
    import mrt_fast.embeddings.static as se

    def timed_load(module, path, load):
        fresh = not path.exists()
        module._LOADED.clear()
        t = time.perf_counter()
        model = load()
        return model, {"seconds": time.perf_counter() - t, "built_now": fresh, "file_mb": path.stat().st_size / 1e6,
                       "dim": model.dim, "model_id": model.model_id}

    spath = static_path("static", a.cache_dir)
    sm, res["static_model"] = timed_load(se, spath, lambda: load_static("static", a.cache_dir, progress=False))
    ipath = int8_path("int8", a.cache_dir)
    im, res["int8_model"] = timed_load(ie, ipath, lambda: load_int8("int8", a.cache_dir, progress=False))
    res["int8_model"]["onnxruntime"] = im.meta.get("onnxruntime")
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
        from mrt_fast.embeddings.quality import markdown, quality_rows, summarize

        rows: list[dict] = []
        rows8: list[dict] = []
        sets = {"mosaic": load_examples().select("prompt_id", "response", "reward"), "pydoc": pydoc_pools(),
                "docstrings": docstring_pools()}
        for name, df in sets.items():
            df = df.sort("prompt_id", maintain_order=True)
            xr = embed_texts(df["response"].to_list(), None, cache_dir=False, device="cpu", progress=False)
            xf = sm.encode(df["response"].to_list())
            rows += quality_rows(name, df, xr, xf, tier="static")
            rows8 += quality_rows(name, df, xr, im.encode(df["response"].to_list()), tier="int8")
        res["quality"] = rows
        res["quality_int8"] = rows8
        if sm.meta.get("train_texts"):
            # the fitting corpus and the evaluation sets share no text
            from mrt_fast.embeddings.static_corpus import corpus_texts

            shown = {t for df in sets.values() for t in df["response"].to_list()}
            corpus = corpus_texts(sm.meta["train_texts"])
            digest = hashlib.sha256("\n".join(corpus).encode("utf-8", "surrogatepass")).hexdigest()
            res["fitting_corpus"] = {"texts": len(corpus), "same_as_model": digest == sm.meta["train_corpus_sha256"],
                                     "texts_also_in_evaluation_sets": len(shown & set(corpus))}
            print("fitting corpus:", res["fitting_corpus"], flush=True)
        for key, rs in (("quality_summary", rows), ("quality_summary_int8", rows8)):
            res[key] = summarize(rs)
            print(markdown(rs), flush=True)
        save()

    # MiniLM, int8 and encode on the same blocks, the order rotating (load drifts on a shared machine)
    kinds = ("encode", "mrt", "mrt_int8", "int8")
    # int8 through the CLI: a fresh cache directory holding a copy of the model (each block's texts are new to it)
    import shutil

    cache8 = tmp / "cache-int8"
    (cache8 / "int8").mkdir(parents=True)
    for f in (ipath, ipath.with_suffix(".json")):
        shutil.copy(f, cache8 / "int8" / f.name)
    spent = dict.fromkeys(kinds, 0.0)
    done = 0
    diffs, cos8 = [], []
    for b, s in enumerate(range(0, a.n, a.block)):
        rows_b = list(range(s, min(s + a.block, a.n)))
        for which in kinds[b % len(kinds):] + kinds[: b % len(kinds)]:
            t0 = time.perf_counter()
            if which == "encode":
                x_st = m.encode([texts[i] for i in rows_b], batch_size=64, normalize_embeddings=True,
                                convert_to_numpy=True, show_progress_bar=False)
            elif which == "int8":
                im.encode([texts[i] for i in rows_b])
            else:
                _, out_b = cli(None if which == "mrt" else "int8", rows_b, None if which == "mrt" else str(cache8))
            spent[which] += time.perf_counter() - t0
            if which == "mrt":
                x_mrt = pl.read_parquet(out_b)["embedding"].to_numpy()
            elif which == "mrt_int8":
                x_8 = pl.read_parquet(out_b)["embedding"].to_numpy()
        diffs.append(float(np.abs(x_mrt - x_st).max()))
        cos8.append(np.sum(x_8 * x_st, axis=1))
        done += len(rows_b)
        rates["encode (sentence-transformers, MiniLM)"] = done / spent["encode"]
        rates["mrt embed (MiniLM)"] = done / spent["mrt"]
        rates["mrt embed --model int8"] = done / spent["mrt_int8"]
        rates["int8 encode (library call)"] = done / spent["int8"]
        res["minilm_texts_done"] = done
        res["mrt_vs_encode_max_abs_diff"] = max(diffs)
        c8 = np.concatenate(cos8)
        res["int8_vs_encode_cosine"] = {"min": float(c8.min()), "p1": float(np.percentile(c8, 1)), "mean": float(c8.mean())}
        floor = rates["encode (sentence-transformers, MiniLM)"]
        res["ratio_to_encode"] = {k: v / floor for k, v in rates.items()}
        res["targets"] = {
            "mrt embed MiniLM within 1.1x of encode": rates["mrt embed (MiniLM)"] >= floor / 1.1,
            "static >= 20x encode": rates["mrt embed --model static"] >= 20 * floor,
        }
        save()
        print(f"{done}/{a.n}: encode {floor:.1f}, mrt embed {rates['mrt embed (MiniLM)']:.1f}, "
              f"int8 {rates['mrt embed --model int8']:.1f} texts/s", flush=True)

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
