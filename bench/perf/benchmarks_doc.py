"""Write docs/results/benchmarks.md from the result files in bench/results/.

Every benchmark script writes its results under bench/results/ (JSON or
JSONL, and for some a ready Markdown table). This script gathers them into
one page, so the page always shows what the last runs measured:

    python bench/perf/benchmarks_doc.py            # rewrite docs/results/benchmarks.md
    python bench/perf/benchmarks_doc.py --check    # exit 1 if the page is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "results" / "benchmarks.md"

# What each result file is, and how to reproduce it; files not listed here
# still appear, under their own name.
SECTIONS = [
    ("select_bench_full", "Selection core against peers and the hardware floor",
     "`python bench/perf/run_select_bench.py --repeats 5` (full size). Workloads: W1 = 15,625 pools x 64 "
     "candidates x 384 dims at K = 4 (diverse and GRADES), against a vectorised NumPy greedy, submodlib "
     "and apricot; W2 = one pool of 20,000 x 384 at K = 100 (dense and on-demand); W3 = one pool of "
     "200,000 x 64 over a symmetrised 32-NN graph at K = 1,000. Every peer's picks are checked against "
     "the NumPy reference. The floor for W1 is max(bytes / measured read bandwidth, Gram flops / "
     "measured float32 GEMM rate)."),
    ("select_bench_quick", "Selection core, smoke size", "`python bench/perf/run_select_bench.py --quick`."),
    ("variance_bench", "Variance accumulator against polars group_by",
     "`python bench/perf/bench_variance.py` (see its `--help`)."),
    ("batch_bench", "Batch jobs on datasets against the polars read/write floor",
     "`python bench/perf/bench_batch.py` (see docs/guides/batch.md)."),
    ("small_bench", "Small jobs: 1M candidates of each shape against the polars read/write floor",
     "`python bench/perf/bench_small.py`: `mrt select` (GRADES, K = 4, in memory, whole process, imports "
     "included) against the faster of polars reading the files into memory or streaming and writing as many "
     "rows, in the same rounds; each ratio the median of each round's ratio to the floor of its round, with "
     "its range. The steps are the job's own `--profile` (medians): the interpreter's start with its imports, "
     "reading, the selection (the GRADES work, which the floor does not do) and writing."),
    ("objects_bench", "Page checksums on object storage: checked against unchecked reads",
     "`python bench/perf/bench_objects.py`: `mrt select` (GRADES, K = 4, in memory, whole process) on the same "
     "Parquet objects written without page checksums (read by polars, nothing to check) and with them (read by "
     "Arrow, every page checked), against an S3-compatible server started on this machine; interleaved rounds, "
     "paired differences with their 95% t interval."),
    ("scale_bench", "Scale: 1M to 100M candidates against the spilling floor",
     "`python bench/perf/bench_scale.py`; the page with its projection to 10B: docs/results/scale.md "
     "(`python bench/perf/scale_doc.py`)."),
    ("limits_bench", "One dataset under memory limits from the refused minimum up",
     "`python bench/perf/bench_limits.py`; the page with its plot: docs/results/limits.md "
     "(`python bench/perf/limits_doc.py`)."),
    ("buckets_bench", "One dataset under one limit, cut into several bucket counts",
     "`python bench/perf/bench_buckets.py`; its table: docs/results/limits.md#bucket-count-under-one-limit "
     "(`python bench/perf/limits_doc.py`)."),
    ("ray_bench", "The Ray engine against the local engine",
     "`python bench/perf/bench_ray.py` (see docs/guides/distributed.md): job = the job's own time (imports and Ray's "
     "start apart); `job_vs_local_spill` = a Ray job over the local engine with the spill forced into "
     "the same part count (target <= 1.5); `per_worker_vs_local_per_core` = rows/s per Ray worker over "
     "the local engine's rows/s per core (target >= 2/3)."),
    ("huge_pool_bench", "One huge pool through `mrt select`: on demand under 512 MB, dense, apricot",
     "`python bench/perf/bench_huge_pool.py`: one prompt's pool (a Gaussian mixture, 64-d float32) in one "
     "Parquet file, `mrt select --method diverse` under `--memory-limit 512MB` (the similarity columns on "
     "demand) against the same command given room for the dense matrix, and against apricot's lazy greedy "
     "on the same float64 clipped-cosine matrix (its import and numba compilation timed apart); whole "
     "processes, interleaved rounds, medians."),
    ("startup_bench", "What `mrt` costs before any work",
     "`python bench/perf/bench_startup.py`: whole processes, medians, beside a bare `python -c pass` "
     "(target < 0.5 s)."),
    ("embed_bench", "Embedding throughput and quality (20,000 texts)",
     "`python bench/perf/bench_embed.py` (see docs/guides/embeddings.md)."),
    ("gpu_bench", "MiniLM and the LLM stages on a GPU, against the CPU",
     "`bash bench/perf/gpu_check.sh prepare`, then `check` and `throughput` on a GPU machine, merged by "
     "`python bench/perf/bench_gpu.py merge` (see docs/guides/embeddings.md, On a GPU)."),
    ("static_ab", "The static tier against MiniLM encode, alternating blocks",
     "`python bench/perf/bench_static_ab.py --threads 2` (see docs/guides/embeddings.md)."),
    ("interval_bench", "Bootstrap interval cost by number of prompts",
     "`python bench/perf/bench_intervals.py` (see docs/results/interval_coverage.md)."),
    ("selection_quality", "Selection quality on pools with known modes",
     "`python bench/experiments/bench_selection_quality.py` (see docs/guides/selection.md): every selector at K = 2, 4, 8 on "
     "docstring pools (sources as modes, MiniLM), text pools of reworded answers (answers as modes, MiniLM), "
     "pools of reworded distinct approaches to one prompt (approaches as modes, MiniLM), "
     "the paper's controlled setup and the MOSAIC examples; GRADES' alpha sweep; the mode rule against "
     "planted modes, by their separation, with its silhouette thresholds and merge cosines (docs/guides/modes.md)."),
    ("answer_modes", "Answer-key modes against the embedding rule",
     "`python bench/experiments/bench_answer_modes.py` (see docs/guides/modes.md and docs/guides/answers.md)."),
    ("sandbox_overhead", "Sandbox start-up overhead",
     "`python bench/perf/sandbox_overhead.py --repeats 30` (see docs/guides/sandbox.md)."),
    ("nll_bench", "`mrt nll` and `mrt score` against a raw batched forward pass",
     "`python bench/perf/bench_nll.py` (see its `--help`): the same pairs, batch size, device and dtype; "
     "`*_ratio` is mrt / raw (target <= 1.2)."),
    ("train_bench", "LoRA training steps: the scored window against every position's logits",
     "`python bench/perf/bench_train.py` (see its `--help`): `mrt_fast.llm.train.train` on the same rows and seed, "
     "alternating arms, one thread; `*_step_s` is the median seconds per optimizer step after the first, "
     "`ratio` is window / whole."),
    ("logprob_vs_nll", "Generation log-probabilities as the pilot loss, against `mrt nll`",
     "`nice python bench/experiments/logprob_vs_nll.py` (see docs/guides/llm_pipeline.md): the correlation of "
     "`-logprob/n_tokens` with the NLL on the same pairs, and the advice from each."),
]


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str)[:80]
    return str(v).replace("|", "/")


def _flat(d: dict, prefix: str = "") -> dict:
    """Nested records become dotted columns; lists of numbers and of records are left out."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif not isinstance(v, list):
            out[f"{prefix}{k}"] = v
    return out


def _table(rows: list[dict]) -> str:
    rows = [_flat(r) for r in rows]
    cols: list[str] = []
    for r in rows:
        for c in r:
            if c not in cols:
                cols.append(c)
    out = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    out += ["| " + " | ".join(_cell(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def _records(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(r, dict) for r in v)


def _subtables(name: str, rows: list[dict]) -> list[str]:
    """Lists of records inside records (e.g. per-stage times of one run), one table each."""
    parts = []
    for r in rows:
        label = next((str(r[c]) for c in ("name", "case", "candidates", "layout") if c in r), "")
        for k, v in r.items():
            if _records(v):
                title = " ".join(x for x in (name, label) if x)
                parts.append(f"**{title}: {k}**\n\n{_table(v)}")
    return parts


def _render_json(obj) -> str:
    """A generic rendering: records become tables, nested records dotted columns, the rest key: value lines."""
    if _records(obj):
        return "\n\n".join([_table(obj), *_subtables("", obj)])
    if isinstance(obj, dict):
        scalars, parts, named = [], [], []
        for k, v in obj.items():
            if _records(v):
                parts += [f"**{k}**\n\n{_table(v)}", *_subtables(k, v)]
            elif isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()) and k != "machine":
                rows = [{"name": n, **x} for n, x in v.items()]
                parts += [f"**{k}**\n\n{_table(rows)}", *_subtables(k, rows)]
            elif isinstance(v, dict) and k != "machine":
                named.append({"name": k, **v})
            elif not isinstance(v, list):
                scalars.append(f"- {k}: {_cell(v)}")
        if named:
            parts.insert(0, f"{_table(named)}")
            parts[1:1] = _subtables("", named)
        return "\n\n".join(([("\n".join(scalars))] if scalars else []) + parts)
    return f"```\n{json.dumps(obj, indent=1, default=str)}\n```"


def _render_batch(doc: dict) -> str:
    """bench_batch.py's results: one row per (dataset size, case)."""
    m = doc.get("machine", {})
    head = [f"- method: {doc.get('method')}, K = {doc.get('k')}; spill memory limit "
            f"{doc.get('spill_limit_bytes', 0) / 1e9:.2f} GB; {m.get('cpus')} CPUs, "
            f"{m.get('mem_total_bytes', 0) / 2**30:.1f} GiB RAM; load average at start "
            f"{_cell((m.get('load_avg_at_start') or [None])[0])}, at end {_cell((m.get('load_avg_at_end') or [None])[0])}",
            "- ratio = wall / floor (floor: polars reading the same files and writing as many rows as the "
            "selection keeps, the faster of `read_parquet` + `write_parquet` and `scan_parquet` + `sink_parquet`; "
            "the median of the rounds); ratio: the median over the rounds of each round's wall over the "
            "floor's in the same round, with its range; targets: <= 1.5 (fit), "
            "<= 2.5 (spill); s per M rows at the largest size within 1.2x of the smallest (per-row vs smallest); "
            "peak RSS <= limit + 300 MB", ""]
    cols = ["candidates", "case", "input GB", "wall s", "floor s", "ratio", "ratio range", "parts", "peak RSS GB",
            "limit GB",
            "RSS - limit GB", "s per M rows", "per-row vs smallest"]
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    for row in doc.get("results", []):
        for case, r in row.get("runs", {}).items():
            vals = [f"{row['candidates']:,}", case, f"{row.get('input_bytes', 0) / 1e9:.2f}", f"{r['seconds']:.2f}",
                    f"{row['floor_seconds']:.2f}", f"{r['ratio_to_floor']:.2f}",
                    (f"{min(r['ratio_runs']):.2f}-{max(r['ratio_runs']):.2f}" if r.get("ratio_runs") else "-"),
                    str(r.get("parts", "")),
                    f"{r['peak_rss_bytes'] / 1e9:.2f}", f"{r['limit_bytes'] / 1e9:.2f}",
                    f"{r['rss_over_limit_bytes'] / 1e9:+.2f}", f"{r['seconds_per_million_rows']:.2f}",
                    f"{r['per_row_vs_smallest']:.2f}" if "per_row_vs_smallest" in r else "-"]
            lines.append("| " + " | ".join(vals) + " |")
    return "\n".join(head + lines)


def _render_embed(doc: dict) -> str:
    """bench_embed.py's results: throughput against encode, then the quality table."""
    m = doc.get("machine", {})
    tok = doc.get("tokens_per_text", {})
    sm = doc.get("static_model", {})
    head = [f"- {doc.get('n_texts', 0):,} texts, {_cell(tok.get('mean'))} tokens per text on average "
            f"(p5 {_cell(tok.get('p5'))}, p95 {_cell(tok.get('p95'))}); {m.get('cpus')} CPUs, torch threads "
            f"{m.get('torch_threads')}; load average at start {_cell((m.get('load_avg_start') or [None])[0])}, "
            f"at end {_cell((m.get('load_avg_end') or [None])[0])}",
            f"- static model: `{sm.get('model_id')}`, {sm.get('dim')} dimensions, {_cell(sm.get('file_mb'))} MB",
            *([f"- int8 model: `{doc['int8_model'].get('model_id')}`, {_cell(doc['int8_model'].get('file_mb'))} MB, "
               f"onnxruntime {doc['int8_model'].get('onnxruntime')}; cosine to `encode` over the texts: "
               f"mean {_cell(doc.get('int8_vs_encode_cosine', {}).get('mean'))}, "
               f"1st percentile {_cell(doc.get('int8_vs_encode_cosine', {}).get('p1'))}, "
               f"min {_cell(doc.get('int8_vs_encode_cosine', {}).get('min'))}"] if doc.get("int8_model") else []),
            f"- `mrt embed` (MiniLM) against `encode`: max abs difference {_cell(doc.get('mrt_vs_encode_max_abs_diff'))}",
            "- targets: " + ", ".join(f"{k}: {'met' if v else 'not met'}" for k, v in doc.get("targets", {}).items()),
            ""]
    ratio = doc.get("ratio_to_encode", {})
    lines = ["| path | texts/s | x encode |", "| --- | ---: | ---: |"]
    for name, tps in doc.get("texts_per_second", {}).items():
        lines.append(f"| {name} | {tps:,.1f} | {ratio.get(name, float('nan')):.2f} |")
    for key, skey, tier in (("quality", "quality_summary", "static"), ("quality_int8", "quality_summary_int8", "int8")):
        q = doc.get(key) or []
        if not q:
            continue
        qs = doc.get(skey, {})
        lines += ["", f"**quality, {tier} tier** (selected with the {tier} tier vs with MiniLM, both scored by MiniLM; "
                  f"gap interval: 95% paired bootstrap over pools; within 2% everywhere: "
                  f"{qs.get('within_tolerance_everywhere')}; same strict ranking everywhere: "
                  f"{qs.get('same_ranking_everywhere')}; selector pairs separated by MiniLM's picks that the "
                  f"{tier} tier reverses: {qs.get('separated_pairs_reversed')} of {qs.get('separated_pairs')})", "",
                  f"| data set | pools | texts | K | selector | coverage, MiniLM picks | coverage, {tier} picks | gap "
                  "| gap 95% CI | same ranking | separated pairs reversed |",
                  "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- | --- | --- |"]
        for r in q:
            ci = r.get("coverage_gap_ci95")
            ci_s = f"[{100 * ci[0]:+.2f}, {100 * ci[1]:+.2f}]" if ci else ""
            sep = r.get("pairs_separated_by_reference")
            sep_s = f"{len(r.get('separated_pairs_reversed', []))} of {len(sep)}" if sep is not None else ""
            lines.append(f"| {r['dataset']} | {r['pools']} | {r['texts']} | {r['k']} | {r['selector']} | "
                         f"{r['coverage_reference']:.4f} | {r['coverage_tier']:.4f} | {100 * r['coverage_gap']:+.2f}% | "
                         f"{ci_s} | {'yes' if r['same_ranking'] else 'no'} | {sep_s} |")
    return "\n".join(head + lines)


def _fixed(v, digits: int = 6) -> str:
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _render_gpu(doc: dict) -> str:
    """bench_gpu.py's merged results: the machine, MiniLM throughput and ratios, the LLM stages' agreement."""
    v = doc.get("versions", {})
    out = [f"- {v.get('gpu')} (CUDA {v.get('cuda')}), {v.get('cpus')} CPUs; torch {v.get('torch')}, transformers "
           f"{v.get('transformers')}, sentence-transformers {v.get('sentence-transformers')}, peft {v.get('peft')}"]
    e = doc.get("embed")
    if e:
        c = e.get("cosine_device_vs_cpu", {})
        out += [f"- MiniLM ({e.get('model_dtype')} in memory) on {e.get('n_texts', 0):,} texts of "
                f"`embed_corpus.mixed_texts`, batch {e.get('batch')} (and {e.get('big_batch')}), median of "
                f"{e.get('repeats')} runs; the CPU rows ({e.get('cpu_threads')} torch threads) and the `subset` "
                f"rows on the first {e.get('n_cpu_texts', 0):,}",
                f"- cosine of each subset row, {e.get('device')} against the CPU: min {_fixed(c.get('min'))}, "
                f"mean {_fixed(c.get('mean'))} (at least {c.get('threshold')}: {'met' if c.get('ok') else 'not met'}); "
                f"`embed_texts` against `encode`: max abs difference {_cell(e.get('embed_texts_vs_encode_max_abs_diff'))}",
                "", "| path | texts/s |", "| --- | ---: |"]
        out += [f"| {k} | {r:,.1f} |" for k, r in e.get("texts_per_second", {}).items()]
        out += ["", "| ratio | value |", "| --- | ---: |"]
        out += [f"| {k} | {r:.2f} |" for k, r in e.get("ratios", {}).items()]
    ll = doc.get("llm")
    if ll:
        out += ["", f"**LLM stages, tiny models: {ll.get('device')} against {ll.get('against')}** "
                "(|device - cpu| <= abs + rel x |cpu| on every row; generation: log-probability per token "
                "against teacher forcing on the CPU in float32)", "",
                "| stage | dtype | rows | max abs diff | max rel diff | tolerance abs / rel | agrees |",
                "| --- | --- | ---: | ---: | ---: | --- | --- |"]
        for name, r in ll.items():
            if not isinstance(r, dict):
                continue
            tol = r.get("tolerance", {})
            out.append(f"| {name} | {r.get('dtype', '')} | {r.get('rows', '')} | {_cell(r.get('max_abs_diff', ''))} | "
                       f"{_cell(r.get('max_rel_diff', ''))} | {_cell(tol.get('abs', ''))} / {_cell(tol.get('rel', ''))} | "
                       f"{'yes' if r.get('ok') else 'no: ' + str(r.get('error', 'outside the tolerance'))} |")
    return "\n".join(out)


#: result files with a rendering of their own (the rest get the generic one)
def _render_scale(doc: dict) -> str:
    """bench_scale.py's curve: the same table as docs/results/scale.md."""
    from scale_doc import table

    m = doc["machine"]
    return "\n".join([f"- {doc['what']}; {doc['dim']}-d {doc['dtype']}, {doc['method']} K = {doc['k']}, limit "
                      f"{doc['limit_bytes'] / 1e9:.1f} GB, {m['cpus']} cores", "", *table(doc)])


def _render_limits(doc: dict) -> str:
    """bench_limits.py's run: the same table as docs/results/limits.md."""
    from limits_doc import render as limits_page

    lines = limits_page(doc).splitlines()
    table = [ln for ln in lines if ln.startswith("|")]
    return "\n".join([f"- {doc['what']}; {doc['candidates'] / 1e6:,.0f}M candidates, {doc['dim']}-d {doc['dtype']}, "
                      f"{doc['machine']['cpus']} cores; the page with its plot: docs/results/limits.md", "", *table])


def _render_huge_pool(doc: dict) -> str:
    """bench_huge_pool.py: one row per pool size and method."""
    out = ["| pool | K | method | seconds (runs) | CPU s | peak RSS MiB | on demand over this | same set |",
           "|---|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        for m, v in r["methods"].items():
            name = {"on_demand": "on demand, limit 512MB", "dense": "dense (room given)",
                    "apricot": "apricot (start apart)"}.get(m, m)
            if m == "on_demand":
                name = f"on demand, limit {v['limit_bytes'] / 1e6:,.0f} MB (peak {v['peak_rss_over_limit']:.0%})"
            runs = ", ".join(f"{x:.1f}" for x in v["runs_seconds"])
            out.append(f"| {r['candidates']:,} x {r['dim']} | {r['k']} | {name} | {v['seconds']:.1f} ({runs}) | "
                       f"{v['cpu_seconds']:.1f} | {v['peak_rss_bytes'] / 2**20:,.0f} | "
                       f"{_fixed(v.get('on_demand_over_this', 1.0), 2) if m != 'on_demand' else '-'} | "
                       f"{v.get('same_set_as_on_demand', '-')} |")
    return "\n".join(out)


def _render_small(doc: dict) -> str:
    out = ["| shape | candidates | input MB | mrt select s | floor s | ratio (range) | start s | read s | "
           "select s | write s | peak RSS MiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        st = r["steps_seconds"]
        start = st.get("start (interpreter, imports, arguments)", float("nan"))
        lo, hi = r["ratio_range"]
        out.append(f"| {r['shape']} | {r['candidates']:,} | {r['input_bytes'] / 1e6:,.0f} | {r['seconds']:.2f} | "
                   f"{r['floor_seconds']:.2f} ({r['floor_kind']}) | {r['ratio_to_floor']:.2f} ({lo:.2f}-{hi:.2f}) | "
                   f"{start:.2f} | {st.get('read', float('nan')):.2f} | {st.get('select', float('nan')):.2f} | "
                   f"{st.get('write', float('nan')):.2f} | {r['peak_rss_bytes'] / 2**20:,.0f} |")
    rounds = sorted({r["rounds"] for r in doc["results"]})
    out += ["", f"Rounds: {', '.join(map(str, rounds))} a shape, interleaved with the floor's; {doc['date']}."]
    return "\n".join(out)


def _render_objects(doc: dict) -> str:
    d = doc["paired_difference_seconds"]
    runs = {k: ", ".join(f"{x:.2f}" for x in v) for k, v in doc["runs_seconds"].items()}
    return "\n".join([
        "| objects | median s | runs s | peak RSS MiB |", "|---|---|---|---|",
        *(f"| {'with page checksums (checked)' if k == 'checked' else 'without (unchecked)'} | "
          f"{doc['seconds'][k]:.2f} | {runs[k]} | {doc['peak_rss_bytes'][k] / 2**20:,.0f} |" for k in ("unchecked", "checked")),
        "", f"{doc['candidates']:,} candidates, {doc['dim']}-d {doc['dtype']}, {doc['files']} files, {doc['rounds']} rounds, "
        f"{doc['date']}. Checked minus unchecked, paired by round: mean {d['mean']:+.2f} s, 95% interval "
        f"{d['ci95'][0]:+.2f} to {d['ci95'][1]:+.2f} s; ratio of the medians {doc['checked_over_unchecked']:.2f}; "
        f"the same kept rows: {doc['same_kept_rows']}."])


RENDERERS = {"objects_bench": _render_objects, "small_bench": _render_small, "huge_pool_bench": _render_huge_pool, "batch_bench": _render_batch, "embed_bench": _render_embed, "gpu_bench": _render_gpu,
             "scale_bench": _render_scale, "limits_bench": _render_limits}


def _load(path: Path):
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


def render() -> str:
    stems: dict[str, list[Path]] = {}
    for p in sorted(RESULTS.glob("*")):
        if p.suffix in (".json", ".jsonl", ".md"):
            stems.setdefault(p.stem, []).append(p)
    known = [s for s, _, _ in SECTIONS]
    order = [s for s in known if s in stems] + sorted(s for s in stems if s not in known)
    about = {s: (t, how) for s, t, how in SECTIONS}
    out = [
        "# Benchmarks",
        "",
        "Generated by `python bench/perf/benchmarks_doc.py` from the files in `bench/results/`; do not edit by hand.",
        "Each benchmark runs mrt_fast side by side with its peer or floor in one run and reports ratios.",
        "Timings are from a 2-core VM; its speed drifts by 10-20% over minutes, so compare ratios within one run.",
    ]
    for s in order:
        title, how = about.get(s, (s, ""))
        out += ["", f"## {title}", ""]
        if how:
            out += [f"How: {how}", ""]
        files = {p.suffix: p for p in stems[s]}
        if ".md" in files:
            body = files[".md"].read_text().strip().splitlines()
            if body and body[0].startswith("# "):
                body = body[1:]
            out += [ln[1:] if ln.startswith("## ") else ln for ln in body]  # demote headings one level
        else:
            p = files.get(".json") or files.get(".jsonl")
            out.append(RENDERERS.get(s, _render_json)(_load(p)))
        out.append("")
        out.append(f"Source: `bench/results/{sorted(p.name for p in stems[s])[0]}`.")
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/results/benchmarks.md is not up to date")
    a = ap.parse_args()
    text = render()
    if a.check:
        ok = DOC.exists() and DOC.read_text() == text
        print("docs/results/benchmarks.md is up to date" if ok else "docs/results/benchmarks.md is stale: run bench/perf/benchmarks_doc.py")
        return 0 if ok else 1
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
