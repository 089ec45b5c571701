"""Write docs/results/scale.md from bench/results/scale_bench.json (the scale curve),
bench/results/ray_curve.json (the Ray engine on the same data, 1 and 2 workers), ray_curve_nodes.json (on two
nodes), scale_consecutive.json and ray_curve_consecutive.json (both engines on pools in consecutive rows) and
bench/results/embed_bench.json (the static embedding tier's rate): the measured curves, their linearity, and the
projection to 1B and 10B candidates with the formula and every input shown.

    python bench/perf/scale_doc.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
#: the published rate of static embeddings on a consumer CPU (sentences per second), the issue's reference
PUBLISHED_STATIC = 107_000
#: the price of one core-hour the cost column assumes (on-demand cloud CPU, order of magnitude)
CORE_HOUR_USD = 0.04
#: cores per node in the projection
NODE_CORES = 32



def span(xs: list[float]) -> str:
    """The range of fractions ``xs`` as percentages (one figure when they round alike)."""
    lo, hi = f"{min(xs):.0%}", f"{max(xs):.0%}"
    return lo if lo == hi else f"{lo}–{hi}"

def size_label(n: int) -> str:
    """1000000 -> "1M"; sizes below a million in full."""
    return f"{n / 1e6:,.0f}M" if n >= 1e6 and n % 1_000_000 == 0 else f"{n:,}"


def fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least squares y = a + b x: (a, b, R^2)."""
    b, a = np.polyfit(x, y, 1)
    pred = a + b * x
    r2 = 1 - float(((y - pred) ** 2).sum()) / float(((y - y.mean()) ** 2).sum())
    return float(a), float(b), r2


def fits(rows: list[dict]) -> str:
    """Which sizes ran in memory and which spilled, in words."""
    name = lambda r: f"{r['candidates'] / 1e6:,.0f}M"  # noqa: E731
    mem = [name(r) for r in rows if r["select"]["parts"] == 1]
    spill = [name(r) for r in rows if r["select"]["parts"] > 1]
    return "; ".join(x for x in (f"{', '.join(mem)} in memory" if mem else "",
                                 f"{', '.join(spill)} spilled" if spill else "") if x)


def table(scale: dict) -> list[str]:
    """The curve: one row per size."""
    out = ["| candidates | input GB | select s | CPU s | floor s | × floor | CPU × floor | rows/s | s per M rows | "
           "per row vs smallest | peak RSS / limit | peak disk GB | parts |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in scale["results"]:
        s, f = r["select"], r["floor"]
        out.append(f"| {size_label(r['candidates'])} | {r['input_bytes'] / 1e9:.2f} | {s['seconds']:.1f} | "
                   f"{s['cpu_seconds']:.1f} | {f['seconds']:.1f} | {s['ratio_to_floor']:.2f} | "
                   f"{s['cpu_ratio_to_floor']:.2f} | {s['rows_per_second']:,.0f} | "
                   f"{s['seconds_per_million_rows']:.2f} | {s['per_row_vs_smallest']:.2f} | "
                   f"{s['peak_rss_over_limit']:.2f} | {s['peak_disk_bytes'] / 1e9:.2f} | {s['parts']} |")
    return out


def breakdown(scale: dict) -> list[str]:
    """Where a spilled job's time went (`mrt select --profile`), beside its floor."""
    rows = [r for r in scale["results"] if r["select"]["parts"] > 1 and r["select"].get("profile")]
    if not rows:
        return []
    steps = ["plan", "spill", "select by bucket", "bucket read", "bucket select", "bucket write"]
    out = ["| candidates | " + " | ".join(steps) + " | floor (all of it) |", "|---|" + "---|" * (len(steps) + 1)]
    for r in rows:
        pr = r["select"]["profile"]
        out.append(f"| {r['candidates'] / 1e6:,.0f}M | " + " | ".join(pr.get(k, "–") for k in steps)
                   + f" | {r['floor']['seconds']:.1f} s wall, {r['floor']['cpu_seconds']:.1f} s CPU |")
    return out


def ray_section(ray: dict, nodes: bool = False) -> list[str]:
    """The Ray engine's curve: every size's local, local-spill and Ray runs, and each engine's straight line;
    ``nodes``: the run on two nodes started with ``ray start`` (``bench_ray.py --nodes``); data of
    ``--order consecutive``: both engines read in place, the local engine in as many parts as Ray's."""
    runs = ray["runs"]
    together = ray.get("order") == "consecutive"
    name = {"local": "local", "local-spill": "local, Ray's part count" if together else "local, spill forced",
            "ray-1": "Ray, 1 worker", "ray-2": "Ray, 2 workers", "ray-2-nodes": "Ray, 2 nodes of 1 CPU"}
    where = ("on two nodes started as separate processes with `ray start` (a head and a worker of 1 CPU each, "
             "the multi-node test's layout: two raylets and two object stores on this machine; "
             "`bench_ray.py --nodes --workers 0`), the job's driver joining by address" if nodes else
             "on a local instance of 1 and 2 CPUs (`ray.init(num_cpus=N)`)")
    if together:
        head = "## The Ray engine on pools in consecutive rows"
        what = (f"`python bench/perf/bench_ray.py --order consecutive` on data of the same kind whose every pool's "
                f"rows are together, as generation writes them ({ray['dim']}-d {ray['dtype']}, pools of 8 to 128, "
                f"{ray['files']} files; GRADES, K = {ray['k']}), each run its own process on this machine: the local "
                "engine with the default limit (in memory below 320 MiB, else read in place), the local engine in as "
                "many parts as the Ray job's (read in place), and the Ray engine reading each part in place, a task "
                f"per part, no exchange, {where}.")
    else:
        head = "## The Ray engine on two nodes" if nodes else "## The Ray engine on the same curve"
        what = (f"`python bench/perf/bench_ray.py` on the same kind of data ({ray['dim']}-d {ray['dtype']}, pools "
                f"of 8 to 128, {ray['files']} files; GRADES, K = {ray['k']}), each run its own process on this "
                "machine: the local engine with the default limit, the local engine with the spill forced into as "
                "many buckets as the Ray job's parts (both engines then write and read every row once), and the Ray "
                f"engine {where}.")
    out = [head, "", what + " Job seconds leave out imports and Ray's start (shown apart); one round per size.", "",
           "| candidates | engine | parts | job s | Ray start s | job / local, same parts | rows/s per worker or "
           "core | same kept rows |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        eng = name.get(r["engine"], f"Ray, {r['workers']} worker{'s' if r['workers'] > 1 else ''}")
        rate = r.get("rows_per_s_per_worker") or r["rows"] / r["job_s"] / max(1, r.get("workers") or 1)
        start = f"{r['ray_start_s']:.1f}" if "ray_start_s" in r else "-"
        vs = f"{r['job_vs_local_spill']:.2f}" if "job_vs_local_spill" in r else "-"
        out.append(f"| {size_label(r['rows'])} | {eng} | {r['parts']} | {r['job_s']:.1f} | {start} | {vs} | "
                   f"{rate:,.0f} | {r.get('same_kept_rows', '-')} |")
    out += [""]
    lines = []
    for eng in sorted({r["engine"] for r in runs}, key=lambda e: (e.startswith("ray"), e)):
        rs = [r for r in runs if r["engine"] == eng]
        if len(rs) >= 3:
            a, b, r2 = fit(np.array([r["rows"] for r in rs], float), np.array([r["job_s"] for r in rs]))
            lines.append(f"{name.get(eng, eng)}: job seconds = {a:.2f} + {b * 1e6:.3f} × millions, R² = {r2:.4f}")
    ratios = [r["job_vs_local_spill"] for r in runs if r["engine"].startswith("ray") and "job_vs_local_spill" in r]
    against = "the local engine in the same parts" if together else "the local engine with the same spill"
    out += ["Straight lines through the sizes: " + "; ".join(lines) + "." if lines else "",
            "", f"Ray jobs against {against}: {min(ratios):.2f}–{max(ratios):.2f}x." if ratios else "", ""]
    return out


def consecutive_section(c: dict) -> list[str]:
    """The same curve on data whose every pool's rows are together: read in place, no spill."""
    rows = c["results"]
    lim = c["limit_bytes"] / 1e9
    out = ["## Pools in consecutive rows", "",
           "`python bench/perf/bench_scale.py --order consecutive --out bench/results/scale_consecutive.json` "
           "runs the same curve on data whose every pool's rows are together, as generation writes them (the "
           "files consecutive runs of rows), with polars' read+write floor (its streaming engine reading the "
           f"files and writing as many rows) beside the spilling floor, under the same `--memory-limit {lim:.0f}GB`. "
           "A size that does not fit in memory is read in place: no spill, no disk but the output.", "",
           "| candidates | input GB | select s | CPU s | how | read+write floor s | × read+write floor | "
           "spilling floor s | × spilling floor | rows/s | s per M rows | peak RSS / limit | peak disk GB |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sel, f, rw = r["select"], r["floor"], r["read_write_floor"]
        how = f"{sel['parts']} parts in place" if sel.get("layout") == "consecutive" else \
            f"{sel['parts']} buckets spilled" if sel["parts"] > 1 else "in memory"
        out.append(f"| {size_label(r['candidates'])} | {r['input_bytes'] / 1e9:.2f} | {sel['seconds']:.1f} | "
                   f"{sel['cpu_seconds']:.1f} | {how} | {rw['seconds']:.1f} | {sel['ratio_to_read_write_floor']:.2f} | "
                   f"{f['seconds']:.1f} | {sel['ratio_to_floor']:.2f} | {sel['rows_per_second']:,.0f} | "
                   f"{sel['seconds_per_million_rows']:.2f} | {sel['peak_rss_over_limit']:.2f} | "
                   f"{sel['peak_disk_bytes'] / 1e9:.2f} |")
    x = np.array([r["candidates"] / 1e6 for r in rows], dtype=float)
    y = np.array([r["select"]["seconds"] for r in rows], dtype=float)
    if len(rows) >= 3:
        a, b, r2 = fit(x, y)
        out += ["", f"Wall time against the size: {a:.2f} s + {b:.3f} s per million candidates (R² {r2:.4f})."]
    rounds = ", ".join(f"{size_label(r['candidates'])} {r['rounds']}" for r in rows)
    out += ["", f"Rounds (job and floors interleaved; medians, each ratio of the medians): {rounds}. "
            "Reproduce: the command above, then `python bench/perf/scale_doc.py`.", ""]
    return out


def render(scale: dict, embed: dict, ray: dict | None = None, nodes: dict | None = None) -> str:
    rows = scale["results"]
    lim = scale["limit_bytes"] / 1e9
    m = scale["machine"]
    out = ["<!-- generated by `python bench/perf/scale_doc.py` from bench/results/scale_bench.json, "
           "bench/results/ray_curve.json, ray_curve_nodes.json, scale_consecutive.json, ray_curve_consecutive.json and "
           "bench/results/embed_bench.json; edit scale_doc.py, "
           "not this page -->", "",
           "# Scale: the measured curve and a projection to 10B candidates", "",
           f"`python bench/perf/bench_scale.py` generates each dataset ({scale['dim']}-d {scale['dtype']} embeddings, "
           "a float64 reward, int64 prompt ids, pools of 8 to 128 candidates, rows shuffled over 8 Parquet files) "
           f"and runs `mrt select` ({scale['method']}, K = {scale['k']}, `--memory-limit "
           f"{lim:.0f}GB`) and its spilling floor in the same run, on one machine of {m['cpus']} cores and "
           f"{m['mem_total_bytes'] / 2**30:.0f} GiB (load average {m['load_avg_at_start'][0]:.1f} at the start, "
           f"{m.get('load_avg_at_end', [float('nan')])[0]:.1f} at the end). The floor is polars reading the files, spilling them to Arrow "
           "IPC with `sink_ipc`, scanning them back and writing as many rows as the selection keeps: what any "
           "out-of-core job over the same bytes pays. Each process's peak RSS is its own high-water mark; disk is "
           "the most the job's output folder (its spill files included) held at once. Sizes up to 10M are the "
           "median of 2 interleaved rounds, larger sizes one round.", "",
           *table(scale)]
    n = np.array([r["candidates"] for r in rows], dtype=float)
    t = np.array([r["select"]["seconds"] for r in rows])
    c = np.array([r["select"]["cpu_seconds"] for r in rows])
    a, b, r2 = fit(n, t)
    ac, bc, r2c = fit(n, c)
    big = rows[-1]
    spilled = [r for r in rows if r["select"]["parts"] > 1]
    out += ["", "## Linearity", "",
            f"A straight line through the {len(rows)} sizes: wall seconds = {a:.2f} + {b * 1e6:.3f} × (millions of "
            f"candidates), R² = {r2:.4f}; CPU seconds = {ac:.2f} + {bc * 1e6:.3f} × millions, R² = {r2c:.4f}. "
            f"Per candidate, the {big['candidates'] / 1e6:,.0f}M job costs {big['select']['per_row_vs_smallest']:.2f}x "
            f"the {rows[0]['candidates'] / 1e6:,.0f}M job's wall time ({fits(rows)}).", ""]
    if spilled:
        use = [r["select"]["peak_rss_over_limit"] for r in spilled]
        ratios = [r["select"]["ratio_to_floor"] for r in spilled]
        names = ", ".join(f"{r['candidates'] / 1e6:,.0f}M" for r in spilled)
        out += [f"Where the job spills ({names}), it takes "
                f"{min(ratios):.2f}–{max(ratios):.2f}x its spilling floor's wall time and peaks at "
                f"{span(use)} of the limit. Where its time went (`mrt select --profile`; the "
                "bucket steps are summed over the buckets, which run on both cores at once, so they can exceed "
                "the step's wall time):", "", *breakdown(scale), ""]
        last = spilled[-1]
        sp = last["select"].get("profile", {}).get("spill", "")
        if sp:
            sel = last["select"]["profile"].get("select by bucket", "")
            spill_wall = float(sp.split(" s")[0])
            floor_wall = last["floor"]["seconds"]
            than = "longer than" if spill_wall > floor_wall else f"{spill_wall / floor_wall:.2f}x"
            out += [f"At {last['candidates'] / 1e6:,.0f}M the spill alone ({sp}) takes {than} the whole floor "
                    f"({floor_wall:.1f} s wall), which reads the same files, writes them as Arrow IPC, "
                    f"scans them back and writes the kept rows; the buckets' reading, selection and writing take "
                    f"{sel} on top. The floor does no selection: the buckets' selection is the GRADES work "
                    "itself (the core's similarity blocks and greedy picks, on both cores).", ""]
    if ray is not None:
        out += ray_section(ray)
    if nodes:
        out += ray_section(nodes, nodes=True)
    # the projection
    cpu_per_row = big["select"]["cpu_seconds"] / big["candidates"]
    disk_per_row = big["select"]["peak_disk_bytes"] / big["candidates"]
    in_per_row = big["input_bytes"] / big["candidates"]
    tps = embed["texts_per_second"]["mrt embed --model static"]
    cores_e = embed["machine"]["cpus"]
    emb_per_row = cores_e / tps
    out += ["## Projection to 1B and 10B candidates", "",
            "Computed from the per-core costs measured above, not measured at that size. Per candidate:", "",
            f"* selection: c_sel = {cpu_per_row * 1e6:.3f} CPU seconds per million candidates (the "
            f"{big['candidates'] / 1e6:,.0f}M job's CPU seconds, spilled, {m['cpus']} cores);",
            f"* embedding with the static tier: c_emb = {emb_per_row * 1e6:.1f} CPU seconds per million texts "
            f"(`mrt embed --model static`, {tps:,.0f} texts/s on {cores_e} cores = {tps / cores_e:,.0f} texts/s per "
            f"core, {embed['n_texts']:,} texts of {embed['tokens_per_text']['mean']:.0f} tokens on average; the "
            f"published figure for static embeddings is about {PUBLISHED_STATIC:,} sentences/s on a whole consumer "
            f"CPU, {PUBLISHED_STATIC / tps:.0f}x this machine's {cores_e} cores; its core count is not given, so "
            "the per-core gap is not known);",
            f"* memory: the job held {lim:.0f} GB for {m['cpus']} cores, {lim / m['cpus']:.1f} GB per core;",
            f"* disk: {in_per_row:.0f} bytes of input and {disk_per_row:.0f} bytes of spill and output at peak per "
            "candidate;",
            f"* cost: {CORE_HOUR_USD} USD per core-hour (an assumption, on-demand cloud CPU); nodes of {NODE_CORES} "
            "cores.", "",
            "Core-hours = N × (c_sel + c_emb) / 3600; hours = core-hours / cores, assuming the work divides across "
            "cores and nodes without loss (measured only from 1 to 2 Ray workers on one machine, above); disk = "
            "N × (input + spill bytes per candidate), spread over the nodes; the exchange moves every candidate's row once "
            f"({in_per_row:.0f} bytes on disk, as Parquet) between nodes when pools are split across input files.",
            "",
            "| candidates | cores | nodes | selection core-h | embedding core-h | hours | memory GB | disk TB "
            "| exchange TB | cost USD | bound by |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n_rows in (1e9, 1e10):
        for cores in (256, 1024):
            nodes = cores // NODE_CORES
            sel_h = n_rows * cpu_per_row / 3600
            emb_h = n_rows * emb_per_row / 3600
            hours = (sel_h + emb_h) / cores
            out.append(f"| {n_rows / 1e9:.0f}B | {cores} | {nodes} | {sel_h:,.1f} | {emb_h:,.0f} | {hours:,.1f} | "
                       f"{cores * lim / m['cpus']:,.0f} | {n_rows * (in_per_row + disk_per_row) / 1e12:,.1f} | "
                       f"{n_rows * in_per_row / 1e12:,.1f} | {(sel_h + emb_h) * CORE_HOUR_USD:,.0f} | "
                       f"{'embedding' if emb_h > sel_h else 'selection'} |")
    out += ["", f"Embedding with the static tier costs {emb_per_row / cpu_per_row:.0f}x the selection per "
            "candidate, so it bounds the projection; with embeddings already in the data (a generator's hidden "
            "states, or embeddings computed once and reused), selection alone is the first column.", "",
            "Reproduce: `python bench/perf/bench_scale.py` (about "
            f"{scale.get('seconds_total', 0) / 60:.0f} minutes here, most of it generating the data), then "
            "`python bench/perf/scale_doc.py`.", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    scale = json.loads((ROOT / "bench" / "results" / "scale_bench.json").read_text())
    embed = json.loads((ROOT / "bench" / "results" / "embed_bench.json").read_text())
    ray_path = ROOT / "bench" / "results" / "ray_curve.json"
    ray = json.loads(ray_path.read_text()) if ray_path.exists() else None
    nodes_path = ROOT / "bench" / "results" / "ray_curve_nodes.json"
    nodes = json.loads(nodes_path.read_text()) if nodes_path.exists() else None
    out = ROOT / "docs" / "results" / "scale.md"
    text = render(scale, embed, ray, nodes)
    cons = ROOT / "bench" / "results" / "scale_consecutive.json"
    if cons.exists():
        text += "\n" + "\n".join(consecutive_section(json.loads(cons.read_text())))
    ray_cons = ROOT / "bench" / "results" / "ray_curve_consecutive.json"
    if ray_cons.exists():
        text += "\n" + "\n".join(ray_section(json.loads(ray_cons.read_text())))
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
