"""The GPU check: the LLM stages and MiniLM embedding on CUDA, against the CPU.

``bench/perf/gpu_check.sh`` runs it on the GPU machine; ``--device cpu`` (and a
small ``--n``) runs the same code here as a dry run. Sections:

* ``versions``: Python, torch, CUDA, the GPU, transformers, peft,
  sentence-transformers, polars, and where mrt_fast was imported from;
* ``llm``: on the tiny offline models of ``mrt_fast.llm.testing``, ``mrt nll``,
  ``mrt score`` and ``mrt train`` with ``--device DEVICE`` against
  ``--device cpu`` on the same data, and transformers generation on DEVICE
  (its own dtype, then float32) whose log-probabilities are checked by teacher
  forcing on the CPU in float32. Each comparison states its dtype and
  tolerance (``TOLERANCE``): float32 on both sides must agree closely,
  bfloat16 on the device (the ``auto`` dtype on CUDA) within bfloat16's
  rounding;
* ``embed``: MiniLM throughput on DEVICE on ``--n`` texts of
  ``embed_corpus.mixed_texts`` (raw ``SentenceTransformer.encode``, the floor;
  ``embed_texts``; the ``mrt embed`` command on a Parquet file, cold cache), at
  ``--batch`` and at ``--big-batch``; the same on the CPU (``--cpu-threads``
  torch threads) on the first ``--n-cpu`` of those texts, with the device
  timed on that subset too, so each ratio compares the same texts; and the
  cosine of every subset row embedded on DEVICE and on the CPU
  (at least ``--min-cosine``);
* ``merge``: the section files into one result (``bench/results/gpu_bench.json``,
  rendered into docs/results/benchmarks.md by ``bench/perf/benchmarks_doc.py``).

Each section writes one JSON file and prints a line per check; a check that
fails is recorded with its one-line error and the section goes on.

    python bench/perf/bench_gpu.py llm --device cpu --out /tmp/llm.json                 # dry run
    python bench/perf/bench_gpu.py embed --device cpu --model /tmp/minilm --n 200 --n-cpu 100 --out /tmp/e.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu_model import cosine_summary  # noqa: E402

#: how far a value computed on the device may be from the CPU's float32 one: |d - c| <= abs + rel * |c|.
#: The half-precision bounds are about 10x what the same models give in that dtype on the CPU
#: (bfloat16: 8e-4 at most on the tiny models' losses, rewards and log-probabilities; float16: 1.3e-4).
TOLERANCE = {"float32": {"abs": 1e-4, "rel": 1e-3}, "bfloat16": {"abs": 1e-2, "rel": 2e-2},
             "float16": {"abs": 2e-3, "rel": 5e-3}}


def agreement(got, ref, dtype: str) -> dict:
    """How ``got`` (device, ``dtype``) compares with ``ref`` (CPU, float32), row by row, under ``TOLERANCE[dtype]``."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape or got.size == 0:
        return {"rows": int(got.size), "dtype": dtype, "ok": False, "error": f"shapes {got.shape} and {ref.shape}"}
    tol = TOLERANCE[dtype]
    diff = np.abs(got - ref)
    ok = bool(np.all(np.isfinite(got)) and np.all(diff <= tol["abs"] + tol["rel"] * np.abs(ref)))
    return {"rows": int(got.size), "dtype": dtype, "max_abs_diff": float(np.max(diff)),
            "max_rel_diff": float(np.max(diff / np.maximum(np.abs(ref), 1e-12))), "tolerance": tol, "ok": ok}


def _one_line(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}"[:300]


def _check(res: dict, name: str, fn) -> None:
    """Run one check into ``res[name]``; a failure becomes ``{"ok": False, "error": ...}``."""
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - one check's failure must not lose the others
        out = {"ok": False, "error": _one_line(e)}
    out["seconds"] = round(time.perf_counter() - t0, 2)
    res[name] = out
    extra = out.get("error") or ", ".join(f"{k} {out[k]:.3g}" for k in ("max_abs_diff", "min") if k in out)
    print(f"{name}: {'ok' if out.get('ok') else 'FAILED'} ({out['seconds']} s{'; ' + extra if extra else ''})",
          flush=True)


def _cli(args: list[str]) -> None:
    """Run ``mrt ARGS`` in this process; a non-zero exit raises with the command's last stderr line."""
    from typer.testing import CliRunner

    from mrt_fast.cli import app

    r = CliRunner().invoke(app, [str(a) for a in args])
    if r.exit_code != 0:
        try:
            err = r.stderr
        except ValueError:  # a click that mixes stderr into stdout
            err = ""
        tail = (err or r.stdout or repr(r.exception)).strip().splitlines()
        raise RuntimeError(f"mrt {args[0]} exited {r.exit_code}: {tail[-1] if tail else ''}")


# ---------------------------------------------------------------------------------------------- versions


def versions() -> dict:
    import importlib.metadata as md

    import mrt_fast

    print(f"mrt_fast from {Path(mrt_fast.__file__).parent}", flush=True)  # said, not recorded
    out = {"python": platform.python_version(), "platform": f"{platform.system()} {platform.machine()}",
           "cpus": os.cpu_count()}
    for pkg in ("torch", "transformers", "peft", "accelerate", "sentence-transformers", "tokenizers", "polars",
                "pyarrow", "numpy", "typer"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    try:
        import torch

        out["cuda"] = torch.version.cuda
        out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        out["bf16_supported"] = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    except Exception as e:  # noqa: BLE001
        out["torch_error"] = _one_line(e)
    return out


# ---------------------------------------------------------------------------------------------- llm


def _pairs_table(n_prompts: int):
    """Two responses per prompt of the tiny corpus: the prompt's own continuation and another sentence."""
    import polars as pl

    from mrt_fast.llm.testing import CORPUS, tiny_prompt_table

    p = tiny_prompt_table(n_prompts)
    other = [CORPUS[(i + 3) % len(CORPUS)][:40] for i in range(p.height)]
    return pl.concat([p.select("prompt_id", "prompt", pl.col("reference").alias("response")),
                      p.select("prompt_id", "prompt").with_columns(pl.Series("response", other))])


def _dtype_name(dtype: str, device: str) -> str:
    from mrt_fast.llm.models import resolve_dtype

    return str(resolve_dtype(dtype, device)).replace("torch.", "")


def _stage_on_both(stage: str, data: Path, model: Path, device: str, against: str, column: str, work: Path,
                   extra: list[str]) -> tuple:
    import polars as pl

    vals = {}
    for dev in dict.fromkeys((device, against)):
        out = work / f"{stage}-{dev.replace(':', '_')}.parquet"
        _cli([stage, data, out, "--model", model, "--device", dev, *extra])
        vals[dev] = pl.read_parquet(out).sort("prompt_id", "response")[column].to_numpy()
    return vals[device], vals[against]


def _train_losses(data: Path, model: Path, device: str, out: Path, steps: int) -> list[float]:
    _cli(["train", data, out, "--model", model, "--max-steps", steps, "--set", f"device={device}",
          "--set", "lora_dropout=0", "--set", "batch_size=2", "--set", "grad_accum=2", "--set", "log_every=1"])
    rows = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines() if x.strip()]
    return [r["loss"] for r in rows if "loss" in r]


def _generation_vs_teacher_forcing(prompts, model: Path, device: str, dtype: str, work: Path) -> dict:
    """Generate on ``device`` in ``dtype``; each candidate's log-probability per token against teacher
    forcing of the same tokens on the CPU in float32. The tiny model's random tokens are often byte
    fragments, so only candidates whose text re-tokenizes to as many tokens that decode back to it are
    compared (short candidates, so that enough do)."""
    import torch
    from transformers import AutoModelForCausalLM

    from mrt_fast.llm.generate import GenerationConfig, generate
    from mrt_fast.llm.models import load_tokenizer, prompt_ids, response_ids

    name = _dtype_name(dtype, device)
    cfg = GenerationConfig(n=8, max_new_tokens=3, backend="transformers", device=device, dtype=dtype, seed=0)
    df = generate(prompts, work / f"gen-{device.replace(':', '_')}-{name}.parquet", str(model), cfg, progress=False)
    tok = load_tokenizer(str(model))
    ref_model = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    got, ref, lengths = [], [], []
    for row in df.iter_rows(named=True):
        p = prompt_ids(tok, row["prompt"], cfg.prompt_format)
        r = response_ids(tok, row["response"], add_eos=row["finish_reason"] == "stop")
        if len(r) != row["n_tokens"] or tok.decode(r[: len(r) - (row["finish_reason"] == "stop")]) != row["response"]:
            continue
        with torch.no_grad():
            lp = torch.log_softmax(ref_model(input_ids=torch.tensor([p + r])).logits[0].float(), -1)
        ref.append(sum(float(lp[len(p) - 1 + t, r[t]]) for t in range(len(r))) / len(r))
        got.append(row["logprob"] / len(r))
        lengths.append(len(r))
    out = agreement(got, ref, name)
    out.update(candidates=df.height, compared="log-probability per token", mean_tokens=float(np.mean(lengths or [0])))
    out["ok"] = out["ok"] and df.height == prompts.height * cfg.n and len(got) >= 1
    return out


def llm_section(device: str, against: str, work: Path, n_prompts: int = 6, train_steps: int = 3) -> dict:
    from mrt_fast.llm.testing import save_tiny_models, tiny_prompt_table

    paths = save_tiny_models(work / "models")
    data = work / "pairs.parquet"
    _pairs_table(n_prompts).write_parquet(data)
    res: dict = {"device": device, "against": against, "models": "mrt_fast.llm.testing tiny Llama (2 layers, hidden 32)"}

    def nll():
        got, ref = _stage_on_both("nll", data, paths["lm"], device, against, "loss", work, ["--batch-size", "4"])
        return agreement(got, ref, "float32")  # a model directory loads in its saved dtype (float32)

    def score():
        got, ref = _stage_on_both("score", data, paths["reward"], device, against, "reward", work,
                                  ["--batch-size", "4"])
        return agreement(got, ref, _dtype_name("auto", device))

    def train():
        got = _train_losses(data, paths["lm"], device, work / f"train-{device.replace(':', '_')}", train_steps)
        ref = _train_losses(data, paths["lm"], against, work / f"train-{against}", train_steps)
        out = agreement(got, ref, "float32")
        out.update(steps=len(got), losses=got)
        out["ok"] = out["ok"] and len(got) == train_steps
        return out

    prompts = tiny_prompt_table(n_prompts, with_reference=False)
    _check(res, "nll", nll)
    _check(res, "score", score)
    _check(res, "train", train)
    _check(res, "generate", lambda: _generation_vs_teacher_forcing(prompts, paths["lm"], device, "auto", work))
    _check(res, "generate_float32",
           lambda: _generation_vs_teacher_forcing(prompts, paths["lm"], device, "float32", work))
    res["ok"] = all(v.get("ok") for v in res.values() if isinstance(v, dict))
    return res


# ---------------------------------------------------------------------------------------------- embed


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _rate(fn, n: int, device: str, repeats: int) -> tuple[float, object]:
    """Texts per second of ``fn()`` (median over ``repeats`` runs) and its last result."""
    times, out = [], None
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return n / statistics.median(times), out


def embed_section(model: str, device: str, n: int, n_cpu: int, batch: int, big_batch: int, cpu_threads: int,
                  repeats: int, min_cosine: float, work: Path) -> dict:
    import polars as pl
    import torch
    from sentence_transformers import SentenceTransformer

    from embed_corpus import mixed_texts
    from mrt_fast.embeddings.embed import embed_texts, load_model

    texts = mixed_texts(n)
    sub = texts[:n_cpu]
    res: dict = {"n_texts": n, "n_cpu_texts": len(sub), "device": device, "batch": batch, "big_batch": big_batch,
                 "cpu_threads": cpu_threads, "repeats": repeats, "model": str(model)}
    enc = dict(normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    raw = SentenceTransformer(str(model), device=device, local_files_only=True)
    res["model_dtype"] = str(next(raw.parameters()).dtype).replace("torch.", "")
    res["mrt_model_dtype"] = str(next(load_model(model, device).parameters()).dtype).replace("torch.", "")
    for b in dict.fromkeys((batch, big_batch)):  # warm up: kernels, allocator, tokenizer
        raw.encode(texts[:512], batch_size=b, **enc)
        embed_texts(texts[:512], model, batch_size=b, cache_dir=False, device=device, progress=False)
    rates: dict[str, float] = {}
    dev = device.split(":")[0]

    def mrt(tx, b, d):
        return lambda: embed_texts(tx, model, batch_size=b, cache_dir=False, device=d, progress=False)

    for b in dict.fromkeys((batch, big_batch)):
        rates[f"encode, {dev}, batch {b}"], x_enc = _rate(lambda: raw.encode(texts, batch_size=b, **enc), n, device,
                                                           repeats)
        rates[f"embed_texts, {dev}, batch {b}"], x_mrt = _rate(mrt(texts, b, device), n, device, repeats)
        if b == batch:
            x_ref = x_enc
            res["embed_texts_vs_encode_max_abs_diff"] = float(np.abs(x_mrt - x_enc).max())
    if torch.cuda.is_available() and dev == "cuda":
        res["gpu_peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)

    # the command: Parquet in and out, a cold cache in a fresh directory
    inp = work / "texts.parquet"
    pl.DataFrame({"response": texts}).write_parquet(inp)
    out = work / "embedded.parquet"
    t0 = time.perf_counter()
    try:
        _cli(["embed", inp, out, "--model", model, "--device", device, "--batch-size", batch,
              "--cache-dir", work / "cache"])
        rates[f"mrt embed, {dev}, batch {batch}"] = n / (time.perf_counter() - t0)
        res["mrt_embed_vs_encode_max_abs_diff"] = float(
            np.abs(pl.read_parquet(out)["embedding"].to_numpy() - x_ref).max())
    except Exception as e:  # noqa: BLE001 - the library rows still count
        res["mrt_embed_error"] = _one_line(e)
        print(f"mrt embed: FAILED ({res['mrt_embed_error']})", flush=True)

    # the same subset on the device and on the CPU
    rates[f"encode, {dev}, batch {batch}, subset"], _ = _rate(lambda: raw.encode(sub, batch_size=batch, **enc),
                                                              len(sub), device, repeats)
    rates[f"embed_texts, {dev}, batch {batch}, subset"], x_dev = _rate(mrt(sub, batch, device), len(sub), device,
                                                                       repeats)
    threads = torch.get_num_threads()
    torch.set_num_threads(cpu_threads)
    try:
        cpu = SentenceTransformer(str(model), device="cpu", local_files_only=True)
        cpu.encode(sub[:64], batch_size=batch, **enc)
        rates[f"encode, cpu {cpu_threads} threads, batch {batch}, subset"], _ = _rate(
            lambda: cpu.encode(sub, batch_size=batch, **enc), len(sub), "cpu", 1)
        rates[f"embed_texts, cpu {cpu_threads} threads, batch {batch}, subset"], x_cpu = _rate(
            mrt(sub, batch, "cpu"), len(sub), "cpu", 1)
    finally:
        torch.set_num_threads(threads)
    res["texts_per_second"] = {k: round(v, 1) for k, v in rates.items()}
    res["ratios"] = {
        "embed_texts / encode": rates[f"embed_texts, {dev}, batch {batch}"] / rates[f"encode, {dev}, batch {batch}"],
        "mrt embed / encode": rates.get(f"mrt embed, {dev}, batch {batch}", float("nan"))
            / rates[f"encode, {dev}, batch {batch}"],
        f"big batch / batch (embed_texts, {dev})":
            rates[f"embed_texts, {dev}, batch {big_batch}"] / rates[f"embed_texts, {dev}, batch {batch}"],
        f"{dev} / cpu (encode, subset)": rates[f"encode, {dev}, batch {batch}, subset"]
            / rates[f"encode, cpu {cpu_threads} threads, batch {batch}, subset"],
        f"{dev} / cpu (embed_texts, subset)": rates[f"embed_texts, {dev}, batch {batch}, subset"]
            / rates[f"embed_texts, cpu {cpu_threads} threads, batch {batch}, subset"],
    }
    res["ratios"] = {k: round(v, 3) for k, v in res["ratios"].items()}
    res["cosine_device_vs_cpu"] = cosine_summary(x_dev, x_cpu, min_cosine)
    res["ok"] = bool(res["cosine_device_vs_cpu"]["ok"] and res["model_dtype"] == "float32"
                     and res["mrt_model_dtype"] == "float32" and "mrt_embed_error" not in res)
    for k, v in res["texts_per_second"].items():
        print(f"{k}: {v:,.1f} texts/s", flush=True)
    print(f"ratios: {json.dumps(res['ratios'])}", flush=True)
    c = res["cosine_device_vs_cpu"]
    print(f"cosine {dev} vs cpu over {c['rows']} rows: min {c['min']:.6f} ({'ok' if c['ok'] else 'FAILED'})",
          flush=True)
    return res


# ---------------------------------------------------------------------------------------------- main


def merge(paths: dict[str, str | None]) -> dict:
    """One result from the section files that exist: ``{section: contents}``."""
    return {k: json.loads(Path(p).read_text()) for k, p in paths.items() if p and Path(p).is_file()}


def _write(obj: dict, out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(obj, indent=1, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="section", required=True)
    v = sub.add_parser("versions")
    v.add_argument("--out", required=True)
    ll = sub.add_parser("llm")
    ll.add_argument("--device", default="cuda")
    ll.add_argument("--against", default="cpu")
    ll.add_argument("--out", required=True)
    e = sub.add_parser("embed")
    e.add_argument("--model", required=True, help="a sentence-transformers folder (the fp16 MiniLM copy)")
    e.add_argument("--device", default="cuda")
    e.add_argument("--n", type=int, default=20_000)
    e.add_argument("--n-cpu", type=int, default=2_000)
    e.add_argument("--batch", type=int, default=64)
    e.add_argument("--big-batch", type=int, default=512)
    e.add_argument("--cpu-threads", type=int, default=os.cpu_count() or 1)
    e.add_argument("--repeats", type=int, default=3)
    e.add_argument("--min-cosine", type=float, default=0.999)
    e.add_argument("--out", required=True)
    m = sub.add_parser("merge")
    m.add_argument("--versions")
    m.add_argument("--llm")
    m.add_argument("--embed")
    m.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    for k, val in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
                   ("TRANSFORMERS_VERBOSITY", "error"), ("TOKENIZERS_PARALLELISM", "true")):
        os.environ.setdefault(k, val)
    if a.section in ("llm", "embed"):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if a.section == "versions":
        res = versions()
        print(" ".join(f"{k}={v}" for k, v in res.items() if k not in ("platform",)), flush=True)
    elif a.section == "merge":
        res = merge({"versions": a.versions, "llm": a.llm, "embed": a.embed})
    else:
        with tempfile.TemporaryDirectory() as d:
            try:
                if a.section == "llm":
                    res = llm_section(a.device, a.against, Path(d))
                else:
                    res = embed_section(a.model, a.device, a.n, a.n_cpu, a.batch, a.big_batch, a.cpu_threads,
                                        a.repeats, a.min_cosine, Path(d))
            except Exception as e:  # noqa: BLE001 - the result file says what stopped the section
                res = {"ok": False, "error": _one_line(e)}
                print(f"{a.section}: FAILED ({res['error']})", flush=True)
    _write(res, a.out)
    return 0 if res.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
