"""Side-by-side selection benchmarks: mrt_fast vs NumPy, submodlib, apricot.

Three workloads, all with the clipped-cosine kernel (S = max(0, cos)):

* W1 many small pools: 15,625 pools x 64 candidates x 384 dims, K = 4,
  diverse (alpha = 0) and GRADES (alpha = 0.75, random rewards);
* W2 one dense pool: 20,000 x 384, K = 100 (on-demand and dense modes);
* W3 one sparse pool: 200,000 x 64, symmetrised 32-NN graph, K = 1,000.

Peers that are too slow to run over a whole workload are timed on a sample
of pools and extrapolated (the output says so). Every peer's picks are
checked against the NumPy reference. Results go to ``bench/results/`` as JSON
and a markdown table of ratios.

    python bench/perf/run_select_bench.py                 # full size
    python bench/perf/run_select_bench.py --quick         # smoke size
    python bench/perf/run_select_bench.py --workloads W1 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path


def _early_threads() -> int:
    """Set thread counts for every library before NumPy is imported."""
    n = os.cpu_count() or 1
    argv = sys.argv
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            n = int(argv[i + 1])
        elif a.startswith("--threads="):
            n = int(a.split("=", 1)[1])
    for var in ("RAYON_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = str(n)
    return n


THREADS = _early_threads()

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import numpy_reference as ref  # noqa: E402

SIZES = {
    "full": {
        "W1": dict(pools=15_625, n=64, d=384, k=4),
        "W2": dict(n=20_000, d=384, k=100),
        "W3": dict(n=200_000, d=64, k=1_000, knn=32),
    },
    "quick": {
        "W1": dict(pools=500, n=64, d=384, k=4),
        "W2": dict(n=3_000, d=384, k=20),
        "W3": dict(n=20_000, d=64, k=100, knn=32),
    },
}


# --------------------------------------------------------------------------
# small helpers


def median(xs):
    return float(np.median(np.asarray(xs, dtype=np.float64)))


LAST_CPU = [0.0]


def timed(fn, *a, **kw):
    """Wall seconds of one call; its CPU seconds (all threads) land in LAST_CPU."""
    c = cpu_s()
    t = time.perf_counter()
    out = fn(*a, **kw)
    wall = time.perf_counter() - t
    LAST_CPU[0] = cpu_s() - c
    return wall, out


def rss_mb() -> float:
    """Current resident set size (MiB)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    """Peak resident set size of this process image (VmHWM, MiB). Unlike
    ru_maxrss it is not inherited from the parent across fork + exec."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_s() -> float:
    """CPU seconds (user + system) of this process, all threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def apricot_compile_s(sparse: bool) -> float:
    """Seconds apricot spends compiling its numba gain kernel. apricot builds
    and compiles this kernel inside every fit() (cache=False), so every fit
    pays it; timing the compile alone lets us report fit time without it."""
    from apricot.functions import facilityLocation as fl

    t = time.perf_counter()
    if sparse:
        fl.calculate_gains_sparse(fl.sdtypes, False, True, False)
    else:
        fl.calculate_gains(fl.dtypes, False, True, False)
    return time.perf_counter() - t


def fmt_s(s: float) -> str:
    if s >= 100:
        return f"{s:,.0f} s"
    if s >= 1:
        return f"{s:.2f} s"
    return f"{s * 1e3:.1f} ms"


def machine_info() -> dict:
    info = {"python": platform.python_version(), "platform": platform.platform(), "threads": THREADS}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            key, _, val = line.partition(":")
            if key.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "L3 cache", "Hypervisor vendor"):
                info[key.strip()] = val.strip()
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            info["MemTotal"] = f.readline().split(":")[1].strip()
    except OSError:
        pass
    vers = {"numpy": np.__version__}
    for mod in ("mrt_fast", "apricot", "submodlib", "scipy", "faiss", "numba", "polars"):
        try:
            m = __import__(mod)
            vers[mod] = getattr(m, "__version__", "?")
        except Exception:  # noqa: BLE001 - a missing peer is reported, not fatal
            vers[mod] = None
    try:
        from importlib.metadata import version

        vers["submodlib"] = version("submodlib-py")
        vers["apricot"] = version("apricot-select")
    except Exception:  # noqa: BLE001
        pass
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg["Build Dependencies"]["blas"]
        vers["numpy_blas"] = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # noqa: BLE001
        pass
    info["versions"] = vers
    return info


# --------------------------------------------------------------------------
# machine rates for the floor


def measure_bandwidth(threads: int, mb: int = 1024, reps: int = 3) -> float:
    """Read bandwidth (bytes/s): threaded np.sum over a large float32 array."""
    from concurrent.futures import ThreadPoolExecutor

    a = np.ones(mb * 1024 * 1024 // 4, dtype=np.float32)
    parts = np.array_split(a, threads)
    best = np.inf
    with ThreadPoolExecutor(threads) as ex:
        for _ in range(reps):
            t = time.perf_counter()
            list(ex.map(np.sum, parts))
            best = min(best, time.perf_counter() - t)
    return a.nbytes / best


def measure_gemm(n: int = 4096, reps: int = 3) -> float:
    """float32 GEMM rate (flop/s) with NumPy's BLAS on all threads."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    best = np.inf
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2.0 * n**3 / best


# --------------------------------------------------------------------------
# data


def pools_data(pools: int, n: int, d: int, seed: int, modes: int = 4, chunk: int = 1024):
    """Row-contiguous pools: candidate = prompt centre + one of `modes` mode
    offsets + noise, so pools have real cluster structure under the cosine."""
    rng = np.random.default_rng(seed)
    x = np.empty((pools * n, d), dtype=np.float32)
    for lo in range(0, pools, chunk):
        hi = min(pools, lo + chunk)
        p = hi - lo
        centre = rng.standard_normal((p, 1, d), dtype=np.float32)
        mode = rng.standard_normal((p, modes, d), dtype=np.float32)
        which = rng.integers(0, modes, size=(p, n))
        xb = centre + 0.8 * np.take_along_axis(mode, which[:, :, None], axis=1)
        xb += 0.6 * rng.standard_normal((p, n, d), dtype=np.float32)
        x[lo * n : hi * n] = xb.reshape(p * n, d)
    rewards = rng.random(pools * n)
    return x, rewards


def mixture_data(n: int, d: int, seed: int, clusters: int):
    """A Gaussian mixture (unit-normalised later by every method)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, d), dtype=np.float32)
    which = rng.integers(0, clusters, size=n)
    x = centres[which] + 0.7 * rng.standard_normal((n, d), dtype=np.float32)
    return np.ascontiguousarray(x)


def knn_graph(x: np.ndarray, knn: int, exact: bool, threads: int):
    """Symmetrised clipped-cosine kNN graph (scipy CSR, float32, diagonal 1)."""
    import faiss
    import scipy.sparse as sp

    faiss.omp_set_num_threads(threads)
    xn = ref.normalize(x)
    n, d = xn.shape
    if exact:
        index = faiss.IndexFlatIP(d)
    else:
        nlist = max(16, int(4 * np.sqrt(n)))
        quant = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quant, d, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(xn)
        index.nprobe = 16
    index.add(xn)
    dist, idx = index.search(xn, knn + 1)
    rows = np.repeat(np.arange(n), knn + 1)
    cols = idx.ravel()
    vals = np.maximum(dist.ravel(), 0.0)
    keep = (cols >= 0) & (cols != rows) & (vals > 0)
    g = sp.csr_matrix((vals[keep], (rows[keep], cols[keep])), shape=(n, n), dtype=np.float32)
    g = g.maximum(g.T).tocsr()
    g = (g + sp.identity(n, dtype=np.float32, format="csr")).tocsr()  # S_ii = 1, no self entries before
    g.eliminate_zeros()
    g.sort_indices()
    return g


# --------------------------------------------------------------------------
# W1: many small pools


def agreement(ref_picks: np.ndarray, picks: np.ndarray, ref_obj: np.ndarray, obj: np.ndarray) -> dict:
    ref_sets = np.sort(ref_picks, axis=1)
    sets = np.sort(picks, axis=1)
    set_diff = ~(ref_sets == sets).all(axis=1)
    order_diff = ~(ref_picks == picks).all(axis=1)
    gap = (np.asarray(ref_obj) - np.asarray(obj)) / np.maximum(np.abs(ref_obj), 1e-300)
    return {
        "pools": int(len(ref_picks)),
        "pools_set_differs": int(set_diff.sum()),
        "pools_order_differs": int(order_diff.sum()),
        "max_rel_objective_gap": float(np.max(np.abs(gap))) if len(gap) else 0.0,
        "mean_rel_objective_gap_where_differs": float(np.mean(gap[set_diff])) if set_diff.any() else 0.0,
    }


def pool_sim(x: np.ndarray, n: int, p: int) -> np.ndarray:
    xn = ref.normalize(x[p * n : (p + 1) * n])
    s = ref.kernel(xn @ xn.T, "clip")
    np.fill_diagonal(s, 1.0)
    return s


def run_w1(cfg: dict, args, rates: dict) -> dict:
    import mrt_fast

    P, n, d, k = cfg["pools"], cfg["n"], cfg["d"], cfg["k"]
    print(f"[W1] generating {P:,} pools x {n} x {d} ...", flush=True)
    x, rewards = pools_data(P, n, d, args.seed)
    offsets = np.arange(P + 1, dtype=np.int64) * n
    rng = np.random.default_rng(args.seed + 1)
    sub_sample = np.sort(rng.choice(P, size=min(P, args.submodlib_pools), replace=False))
    apr_sample = np.sort(rng.choice(P, size=min(P, args.apricot_pools), replace=False))

    times: dict[str, list] = {}
    cpu: dict[str, list] = {}
    out: dict = {}

    def rec(name, secs):
        times.setdefault(name, []).append(secs)
        cpu.setdefault(name, []).append(LAST_CPU[0])

    def run_submodlib():
        from submodlib import FacilityLocationFunction

        picks = []
        c = cpu_s()
        t = time.perf_counter()
        for p in sub_sample:
            s = pool_sim(x, n, p)
            f = FacilityLocationFunction(n=n, mode="dense", sijs=s, separate_rep=False)
            res = f.maximize(budget=k, optimizer="LazyGreedy", stopIfZeroGain=False, stopIfNegativeGain=False,
                             verbose=False, show_progress=False)
            picks.append([int(j) for j, _ in res])
        LAST_CPU[0] = (cpu_s() - c) / len(sub_sample)
        return (time.perf_counter() - t) / len(sub_sample), np.array(picks)

    def run_apricot():
        from apricot import FacilityLocationSelection

        picks = []
        c = cpu_s()
        t = time.perf_counter()
        for p in apr_sample:
            s = pool_sim(x, n, p).astype(np.float64)
            sel = FacilityLocationSelection(k, metric="precomputed", optimizer="lazy").fit(s)
            picks.append(list(sel.ranking))
        LAST_CPU[0] = (cpu_s() - c) / len(apr_sample)
        return (time.perf_counter() - t) / len(apr_sample), np.array(picks)

    have_sub = have_apr = True
    try:
        import submodlib  # noqa: F401
    except ImportError:
        have_sub = False
    try:
        import apricot  # noqa: F401
    except ImportError:
        have_apr = False

    res_m = {}
    res_np = {}
    for rep in range(args.repeats):
        print(f"[W1] repeat {rep + 1}/{args.repeats}", flush=True)
        for label, alpha in (("diverse", 0.0), ("grades", 0.75)):
            rw = rewards if alpha > 0 else None
            t, r = timed(mrt_fast.facility_location, x, k, offsets=offsets, rewards=rw, alpha=alpha, kernel="clip")
            rec(f"mrt_fast/{label}", t)
            res_m[label] = r
            t, r = timed(ref.batched_facility_location, x, n, k, rewards=rw, alpha=alpha, kern="clip",
                         chunk_pools=args.chunk_pools, workers=THREADS)
            rec(f"numpy/{label}", t)
            res_np[label] = r
        # diagnostics: the Gram blocks alone (NumPy batched matmul) and mrt_fast at K = 1
        def gram_only():
            from concurrent.futures import ThreadPoolExecutor

            from threadpoolctl import threadpool_limits

            def one(lo):
                hi = min(P, lo + args.chunk_pools)
                xb = ref.normalize(x[lo * n : hi * n]).reshape(hi - lo, n, d)
                ref.gram_blocks(xb, "clip")

            with threadpool_limits(1), ThreadPoolExecutor(THREADS) as ex:
                list(ex.map(one, range(0, P, args.chunk_pools)))

        rec("diag/numpy_gram_only", timed(gram_only)[0])
        rec("diag/mrt_fast_k1", timed(mrt_fast.facility_location, x, 1, offsets=offsets, kernel="clip")[0])
        if have_sub:
            t, sub_picks = run_submodlib()
            rec("submodlib_per_pool", t)
        if have_apr and rep < args.apricot_repeats:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t, apr_picks = run_apricot()
            rec("apricot_per_pool", t)
            comp = [apricot_compile_s(False) for _ in range(2)]
            LAST_CPU[0] = float("nan")
            rec("apricot_compile_per_fit", min(comp))

    # agreement
    for label in ("diverse", "grades"):
        mi = np.stack(res_m[label].indices)
        out[f"agreement/mrt_fast_vs_numpy/{label}"] = agreement(res_np[label][0], mi, res_np[label][1],
                                                                res_m[label].objective)
    for name, sample, picks, ok in (("submodlib", sub_sample, sub_picks if have_sub else None, have_sub),
                                    ("apricot", apr_sample, apr_picks if have_apr else None, have_apr)):
        if not ok:
            continue
        rp = res_np["diverse"][0][sample]
        robj = res_np["diverse"][1][sample]
        pobj = np.array([ref.objective_dense(pool_sim(x, n, p), picks[i]) for i, p in enumerate(sample)])
        out[f"agreement/{name}_vs_numpy/diverse"] = agreement(rp, picks, robj, pobj)

    med = {kk: median(v) for kk, v in times.items()}
    if have_sub:
        med["submodlib/diverse"] = med["submodlib_per_pool"] * P
    if have_apr:
        med["apricot/diverse"] = med["apricot_per_pool"] * P
        med["apricot_nocompile/diverse"] = max(0.0, med["apricot_per_pool"] - med["apricot_compile_per_fit"]) * P
    med_cpu = {kk: median(v) for kk, v in cpu.items()}
    bytes_ = x.nbytes
    flops = 2.0 * n * n * d * P
    floor = max(bytes_ / rates["bandwidth_Bps"], flops / rates["gemm_flops"])
    rows = []
    for label in ("diverse", "grades"):
        tm = med[f"mrt_fast/{label}"]
        row = {"workload": f"W1 {label}", "mrt_fast_s": tm, "floor_s": floor, "x_floor": tm / floor,
               "mrt_fast_cpu_s": med_cpu[f"mrt_fast/{label}"],
               "peers": {"numpy_batched": {"s": med[f"numpy/{label}"], "speedup": med[f"numpy/{label}"] / tm,
                                           "cpu_speedup": med_cpu[f"numpy/{label}"] / med_cpu[f"mrt_fast/{label}"],
                                           # each repeat runs mrt_fast then NumPy back to back: the ratio
                                           # within a pair is less exposed to the machine's drift
                                           "paired_speedups": [b / a for a, b in zip(times[f"mrt_fast/{label}"],
                                                                                     times[f"numpy/{label}"])]}}}
        if label == "diverse":
            if have_sub:
                row["peers"]["submodlib"] = {"s": med["submodlib/diverse"], "speedup": med["submodlib/diverse"] / tm,
                                             "cpu_speedup": med_cpu["submodlib_per_pool"] * P / med_cpu["mrt_fast/diverse"],
                                             "extrapolated_from_pools": int(len(sub_sample))}
            if have_apr:
                row["peers"]["apricot"] = {"s": med["apricot/diverse"], "speedup": med["apricot/diverse"] / tm,
                                           "extrapolated_from_pools": int(len(apr_sample))}
                row["peers"]["apricot without numba compile"] = {
                    "s": med["apricot_nocompile/diverse"], "speedup": med["apricot_nocompile/diverse"] / tm,
                    "extrapolated_from_pools": int(len(apr_sample))}
        rows.append(row)
    x = None  # the pool data is freed (the runners above read it)
    return {"config": cfg, "raw_times": times, "raw_cpu": cpu, "medians": med, "cpu_medians": med_cpu, "rows": rows,
            "floor": {"bytes": bytes_, "flops": flops, "bytes_s": bytes_ / rates["bandwidth_Bps"],
                      "flops_s": flops / rates["gemm_flops"]},
            "gram_share_of_numpy_diverse": med["diag/numpy_gram_only"] / med["numpy/diverse"],
            **out}


# --------------------------------------------------------------------------
# W2 / W3 workers: one subprocess each so that peak memory is per method


def worker(name: str, data: str, k: int, repeats: int) -> dict:
    """Run one method on the saved data; returns times, picks, objective, memory."""
    warnings.simplefilter("ignore")
    import scipy.sparse as sp

    res: dict = {"method": name}
    if data.endswith(".npz"):
        g = sp.load_npz(data).tocsr()
        base = rss_mb()
    else:
        x = np.load(data)
        base = rss_mb()
    res["rss_base_mb"] = base
    times = []
    cpu0 = cpu_s()
    if name in ("mrt_on_demand", "mrt_dense"):
        import mrt_fast

        mem = "on_demand" if name == "mrt_on_demand" else "dense"
        base = rss_mb()
        for _ in range(repeats):
            t, r = timed(mrt_fast.facility_location, x, k, kernel="clip", memory=mem)
            times.append(t)
        picks = r.indices
    elif name == "mrt_sparse":
        import mrt_fast

        base = rss_mb()
        for _ in range(repeats):
            t, r = timed(mrt_fast.facility_location, similarity=g, k=k, symmetric=True)  # g = max(S, S^T)
            times.append(t)
        picks = r.indices
    elif name in ("apricot_dense", "submodlib_dense", "numpy_dense"):
        if name == "apricot_dense":
            import apricot  # noqa: F401  (import cost outside the timing)
        if name == "submodlib_dense":
            import submodlib  # noqa: F401
        base = rss_mb()
        for _ in range(repeats):
            t0 = time.perf_counter()
            xn = ref.normalize(x)
            n = len(xn)
            s = np.empty((n, n), dtype=np.float64 if name == "apricot_dense" else np.float32)
            for lo in range(0, n, 2048):
                blk = ref.kernel(xn[lo : lo + 2048] @ xn.T, "clip")
                s[lo : lo + 2048] = blk
            np.fill_diagonal(s, 1.0)
            t1 = time.perf_counter()
            if name == "apricot_dense":
                from apricot import FacilityLocationSelection

                sel = FacilityLocationSelection(k, metric="precomputed", optimizer="lazy").fit(s)
                picks = np.asarray(sel.ranking, dtype=np.int64)
            elif name == "submodlib_dense":
                from submodlib import FacilityLocationFunction

                f = FacilityLocationFunction(n=n, mode="dense", sijs=s, separate_rep=False)
                out = f.maximize(budget=k, optimizer="LazyGreedy", stopIfZeroGain=False, stopIfNegativeGain=False,
                                 verbose=False, show_progress=False)
                picks = np.array([j for j, _ in out], dtype=np.int64)
            else:
                picks, _ = ref.dense_greedy(s, k)
            t2 = time.perf_counter()
            times.append(t2 - t0)
            res.setdefault("similarity_build_s", []).append(t1 - t0)
            res.setdefault("select_s", []).append(t2 - t1)
            del s
    elif name in ("apricot_sparse", "numpy_sparse"):
        base = rss_mb()
        if name == "apricot_sparse":
            from apricot import FacilityLocationSelection

            g64 = g.astype(np.float64)
            for _ in range(repeats):
                t, sel = timed(FacilityLocationSelection(k, metric="precomputed", optimizer="lazy").fit, g64)
                times.append(t)
            res["numba_compile_s"] = min(apricot_compile_s(True) for _ in range(2))
            picks = np.asarray(sel.ranking, dtype=np.int64)
        else:
            for _ in range(repeats):
                t, (picks, _) = timed(ref.sparse_lazy_greedy, g, k)
                times.append(t)
    else:
        raise ValueError(f"unknown worker {name!r}")
    res["times_s"] = times
    res["cpu_s_total"] = cpu_s() - cpu0
    res["picks"] = [int(i) for i in picks]
    res["rss_peak_mb"] = peak_rss_mb()
    res["rss_extra_mb"] = peak_rss_mb() - base
    return res


def spawn(name: str, data: str, k: int, repeats: int, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--threads", str(threads), "--_worker", name, "--_data", data,
           "--_k", str(k), "--_reps", str(repeats)]
    print(f"    running {name} x{repeats} ...", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"method": name, "error": (p.stderr or p.stdout)[-2000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def single_pool_rows(label: str, results: dict, ref_name: str, mrt_names: list, objective) -> tuple[list, dict]:
    agree = {}
    rp = results[ref_name].get("picks")
    robj = objective(rp) if rp is not None else None
    for m, r in results.items():
        if "error" in r or m == ref_name or rp is None:
            continue
        pk = r["picks"]
        o = objective(pk)
        agree[m] = {"same_set": sorted(pk) == sorted(rp), "same_order": pk == rp,
                    "n_differ": len(set(pk) ^ set(rp)) // 2, "rel_objective_gap": (robj - o) / robj}
    rows = []
    for mn in mrt_names:
        if "error" in results.get(mn, {"error": 1}):
            continue
        tm = median(results[mn]["times_s"])
        row = {"workload": f"{label} {mn}", "mrt_fast_s": tm, "rss_extra_mb": results[mn]["rss_extra_mb"], "peers": {}}
        for pn, pr in results.items():
            if pn.startswith("mrt") or "error" in pr:
                continue
            # apricot sparse: the first fit compiles (cold), the rest are warm
            if pn == "apricot_sparse" and len(pr["times_s"]) > 1:
                cold, warm = pr["times_s"][0], median(pr["times_s"][1:])
                nocomp = max(0.0, warm - pr.get("numba_compile_s", 0.0))
                row["peers"]["apricot (cold: first fit in a fresh process)"] = {
                    "s": cold, "speedup": cold / tm, "rss_extra_mb": pr["rss_extra_mb"]}
                row["peers"]["apricot (warm: later fit, still recompiles)"] = {"s": warm, "speedup": warm / tm}
                row["peers"]["apricot without numba compile"] = {"s": nocomp, "speedup": nocomp / tm}
                continue
            ps = median(pr["times_s"])
            row["peers"][pn] = {"s": ps, "speedup": ps / tm, "rss_extra_mb": pr["rss_extra_mb"]}
            if "select_s" in pr:
                row["peers"][pn]["select_only_s"] = median(pr["select_s"])
        rows.append(row)
    return rows, agree


def run_w2(cfg: dict, args, tmp: Path) -> dict:
    n, d, k = cfg["n"], cfg["d"], cfg["k"]
    print(f"[W2] one dense pool {n:,} x {d}, K = {k}", flush=True)
    x = mixture_data(n, d, args.seed + 2, clusters=max(10, n // 100))
    path = str(tmp / "w2.npy")
    np.save(path, x)
    xn = ref.normalize(x)
    del x
    results = {}
    methods = [("mrt_on_demand", args.repeats), ("mrt_dense", args.repeats),
               ("apricot_dense", args.slow_repeats), ("numpy_dense", 1)]
    if args.slow_peers:
        methods.append(("submodlib_dense", 1))
    for m, reps in methods:
        results[m] = spawn(m, path, k, reps, THREADS)

    def objective(picks):
        cols = np.maximum(xn @ xn[np.asarray(picks)].T, 0.0)
        cols[np.asarray(picks), np.arange(len(picks))] = 1.0
        return float(cols.max(axis=1).astype(np.float64).sum())

    rows, agree = single_pool_rows("W2", results, "numpy_dense", ["mrt_on_demand", "mrt_dense"], objective)
    skipped = [] if args.slow_peers else ["submodlib_dense (about 130 s and +3.1 GB at full size; run with --slow-peers)"]
    for r in results.values():
        r.pop("picks", None)
    return {"config": cfg, "results": results, "rows": rows, "agreement_vs_numpy_dense": agree,
            "embedding_mb": n * d * 4 / 2**20, "skipped": skipped}


def run_w3(cfg: dict, args, tmp: Path) -> dict:
    import scipy.sparse as sp

    n, d, k, knn = cfg["n"], cfg["d"], cfg["k"], cfg["knn"]
    print(f"[W3] one sparse pool {n:,} x {d}, {knn}-NN graph, K = {k}", flush=True)
    x = mixture_data(n, d, args.seed + 3, clusters=max(10, n // 100))
    tg, g = timed(knn_graph, x, knn, args.exact_graph, THREADS)
    del x
    print(f"    graph: {g.nnz:,} entries in {tg:.1f} s", flush=True)
    path = str(tmp / "w3.npz")
    sp.save_npz(path, g, compressed=False)
    results = {}
    for m, reps in (("mrt_sparse", args.repeats), ("apricot_sparse", max(2, args.slow_repeats + 1)), ("numpy_sparse", 1)):
        results[m] = spawn(m, path, k, reps, THREADS)
    rows, agree = single_pool_rows("W3", results, "numpy_sparse", ["mrt_sparse"], lambda p: ref.objective_sparse(g, p))
    for r in results.values():
        r.pop("picks", None)
    return {"config": cfg, "graph": {"build_s": tg, "nnz": int(g.nnz), "index": "IndexFlatIP (exact)" if args.exact_graph
                                     else "IndexIVFFlat (nlist 4 sqrt(n), nprobe 16)",
                                     "csr_mb": (g.data.nbytes + g.indices.nbytes + g.indptr.nbytes) / 2**20},
            "results": results, "rows": rows, "agreement_vs_numpy_sparse": agree,
            "skipped": ["submodlib sparse (does not finish in hours at this size)"]}


# --------------------------------------------------------------------------
# report


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"# Selection benchmark ({report['size']})", "",
             f"Command: `{report['command']}`", "",
             f"Machine: {m.get('Model name', '?')}, {m.get('CPU(s)', '?')} CPUs, {m.get('MemTotal', '?')}; "
             f"threads used: {m['threads']}; measured read bandwidth {report['rates']['bandwidth_Bps'] / 1e9:.1f} GB/s, "
             f"float32 GEMM {report['rates']['gemm_flops'] / 1e9:.0f} GFLOP/s.", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v), "",
             "Times are wall-clock medians over repeats, peers and mrt_fast interleaved in the same run; "
             "speed-up = peer time / mrt_fast time (higher is better for mrt_fast). All methods use the clipped "
             "cosine S = max(0, cos), diagonal 1. NumPy batched reference: chunks of pools on one thread each "
             "(BLAS held at one thread; a multi-threaded BLAS is far slower on stacked 64 x 64 blocks). "
             "Peers given a precomputed similarity (apricot, submodlib, NumPy dense) are timed including building it. "
             "Memory: peak RSS (VmHWM) of a fresh process minus its RSS after loading the data.", "",
             "| workload | mrt_fast | peer | peer time | speed-up | note |", "| --- | --- | --- | --- | --- | --- |"]
    for w in ("W1", "W2", "W3"):
        if w not in report:
            continue
        for row in report[w]["rows"]:
            first = True
            for pn, pr in row["peers"].items():
                note = []
                if "extrapolated_from_pools" in pr:
                    note.append(f"sampled {pr['extrapolated_from_pools']} pools, extrapolated")
                if "rss_extra_mb" in pr:
                    note.append(f"peak +{pr['rss_extra_mb']:,.0f} MiB")
                if "select_only_s" in pr:
                    note.append(f"selection alone {fmt_s(pr['select_only_s'])}")
                if "paired_speedups" in pr:
                    ps = pr["paired_speedups"]
                    note.append(f"per-repeat pairs {min(ps):.1f}x to {max(ps):.1f}x, median {median(ps):.1f}x")
                mt = fmt_s(row["mrt_fast_s"]) if first else ""
                if first and "rss_extra_mb" in row:
                    mt += f" (+{row['rss_extra_mb']:,.0f} MiB)"
                lines.append(f"| {row['workload'] if first else ''} | {mt} | {pn} | {fmt_s(pr['s'])} | "
                             f"{pr['speedup']:.1f}x | {'; '.join(note)} |")
                first = False
            if "floor_s" in row:
                lines.append(f"| | | floor | {fmt_s(row['floor_s'])} | mrt_fast at {row['x_floor']:.2f}x the floor | "
                             "max(bytes / bandwidth, Gram flops / GEMM rate) |")
    lines.append("")
    if "W1" in report:
        w1 = report["W1"]
        md = w1["medians"]
        lines += ["W1 diagnostics: NumPy batched Gram blocks alone "
                  f"{fmt_s(md['diag/numpy_gram_only'])} ({100 * w1['gram_share_of_numpy_diverse']:.0f}% of the NumPy reference); "
                  f"mrt_fast at K = 1 {fmt_s(md['diag/mrt_fast_k1'])} vs K = 4 {fmt_s(md['mrt_fast/diverse'])}; "
                  f"floor terms: bytes {fmt_s(w1['floor']['bytes_s'])}, flops {fmt_s(w1['floor']['flops_s'])}.", ""]
    lines.append("Agreement with the NumPy reference (same greedy, ties to the lower index):")
    lines.append("")
    for w in ("W1", "W2", "W3"):
        if w not in report:
            continue
        for key, val in report[w].items():
            if key.startswith("agreement"):
                if isinstance(val, dict) and "pools" in val:
                    lines.append(f"- {w} {key.split('/', 1)[1]}: {val['pools_set_differs']} of {val['pools']} pools "
                                 f"pick a different set ({val['pools_order_differs']} a different order); "
                                 f"max relative objective gap {val['max_rel_objective_gap']:.1e}")
                elif isinstance(val, dict):
                    for mname, a in val.items():
                        lines.append(f"- {w} {mname}: same set {a['same_set']}, same order {a['same_order']}, "
                                     f"{a['n_differ']} picks differ, relative objective gap {a['rel_objective_gap']:.1e}")
        for s in report[w].get("skipped", []):
            lines.append(f"- {w} skipped: {s}")
        if "measured" in report[w]:
            ms = report[w]["measured"]
            lines.append(f"- {w} measured apart, {ms['started']} to {ms['finished']}: `{ms['command']}`")
        if w == "W3":
            gr = report[w]["graph"]
            lines.append(f"- W3 graph ({gr['index']}): {gr['nnz']:,} entries, {gr['csr_mb']:.0f} MiB CSR, "
                         f"built in {fmt_s(gr['build_s'])} (not in the selection times)")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small smoke sizes")
    ap.add_argument("--workloads", default="W1,W2,W3", help="comma list of W1,W2,W3")
    ap.add_argument("--repeats", type=int, default=3, help="repeats for mrt_fast and fast peers")
    ap.add_argument("--slow-repeats", type=int, default=1, help="repeats for slow peers (apricot dense)")
    ap.add_argument("--apricot-repeats", type=int, default=1, help="W1: repeats of the apricot sample")
    ap.add_argument("--submodlib-pools", type=int, default=500, help="W1: pools timed for submodlib")
    ap.add_argument("--apricot-pools", type=int, default=5, help="W1: pools timed for apricot")
    ap.add_argument("--chunk-pools", type=int, default=128, help="W1: pools per NumPy batched chunk")
    ap.add_argument("--slow-peers", action="store_true", help="also run submodlib on W2 (minutes, GBs)")
    ap.add_argument("--exact-graph", action="store_true", help="W3: exact kNN (IndexFlatIP) instead of IVF")
    ap.add_argument("--threads", type=int, default=THREADS, help="threads for every library (default: all CPUs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=str(HERE.parent / "results"))
    ap.add_argument("--into", default=None, help="replace the workloads run in this existing report (JSON; its "
                    ".md is rewritten), each recording when and how it was measured")
    ap.add_argument("--_worker", help=argparse.SUPPRESS)
    ap.add_argument("--_data", help=argparse.SUPPRESS)
    ap.add_argument("--_k", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_reps", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._worker:
        print(json.dumps(worker(args._worker, args._data, args._k, args._reps)))
        return

    size = "quick" if args.quick else "full"
    if args.quick:
        args.submodlib_pools = min(args.submodlib_pools, 100)
        args.apricot_pools = min(args.apricot_pools, 2)
    wl = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    bad = [w for w in wl if w not in ("W1", "W2", "W3")]
    if bad:
        ap.error(f"unknown workloads {bad}; choose from W1,W2,W3")

    report: dict = {"size": size, "command": "python bench/perf/run_select_bench.py " + " ".join(sys.argv[1:]),
                    "started": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_info()}
    print("measuring bandwidth and GEMM rate ...", flush=True)
    report["rates"] = {"bandwidth_Bps": measure_bandwidth(THREADS), "gemm_flops": measure_gemm()}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        if "W1" in wl:
            report["W1"] = run_w1(SIZES[size]["W1"], args, report["rates"])
        if "W2" in wl:
            report["W2"] = run_w2(SIZES[size]["W2"], args, tmp)
        if "W3" in wl:
            report["W3"] = run_w3(SIZES[size]["W3"], args, tmp)
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    if args.into:
        into = Path(args.into)
        whole = json.loads(into.read_text())
        if whole.get("size") != size:
            ap.error(f"--into {into} holds a {whole.get('size')!r} report, this run is {size!r}")
        for w in wl:
            whole[w] = {**report[w], "measured": {"started": report["started"], "finished": report["finished"],
                                                  "command": report["command"], "rates": report["rates"]}}
        report, out, stem = whole, into.parent, into.stem
    else:
        out = Path(args.out_dir)
        stem = f"select_bench_{size}" + ("" if wl == ["W1", "W2", "W3"] else "_" + "_".join(wl))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1, default=float))
    md = markdown(report)
    (out / f"{stem}.md").write_text(md)
    print(md)
    print(f"wrote {out / stem}.json and .md")


if __name__ == "__main__":
    main()
