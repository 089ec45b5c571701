"""What checking page checksums costs on object storage: `mrt select` on the same Parquet objects written
with and without page checksums, against an S3-compatible server (moto's, started here on 127.0.0.1).

Objects without checksums are read by polars, as ever; objects with them by Arrow, every page checked
(:mod:`mrt_fast.datasets.checked_objects`). One dataset (``bench_batch.make_dataset``: 32-d float16
embeddings, pools of 8-128, 8 files) is uploaded twice, once as written and once rewritten with page
checksums; each `mrt select` (GRADES, K = 4, in memory, whole process) runs ``--repeats`` interleaved
rounds, and each round's pair gives a difference (checked minus unchecked): its mean with a 95% t
interval, and the ratio of the medians. The server runs in this process on the same 2 cores, so the
absolute times are this machine's, not a cloud's. Results: ``bench/results/objects_bench.json``.

    python bench/perf/bench_objects.py                    # 2M candidates, 5 rounds
    python bench/perf/bench_objects.py --size 2e5 --repeats 2 --out /tmp/o.json
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from bench_batch import compile_package, machine, make_dataset, measure, package_env, parse_size  # noqa: E402


def t_interval(d: list[float]) -> tuple[float, float, float]:
    """Mean of the paired differences and its 95% t interval."""
    from scipy import stats

    x = np.asarray(d, dtype=float)
    m = float(x.mean())
    if len(x) < 2:
        return m, float("nan"), float("nan")
    h = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return m, m - h, m + h


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2e6", help="candidates")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "objects_bench.json"))
    a = ap.parse_args(argv)
    import boto3
    import pyarrow.parquet as pq
    from moto.server import ThreadedMotoServer

    from bench_batch import write_result

    compile_package()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    s3 = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
          "AWS_REGION": "us-east-1"}
    env = {**package_env(), **s3}
    size = parse_size(a.size)
    try:
        client = boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"], aws_access_key_id="bench",
                              aws_secret_access_key="bench", region_name="us-east-1")
        client.create_bucket(Bucket="bench-objects")
        with tempfile.TemporaryDirectory(prefix="mrt-objects-") as tmp:
            d = Path(tmp) / "plain"
            make_dataset(d, size, 8, 32, dtype="float16", candidate_column=False)
            for f in sorted(d.glob("*.parquet")):
                client.upload_file(str(f), "bench-objects", f"plain/{f.name}")
                crc = Path(tmp) / f"crc-{f.name}"
                md = pq.ParquetFile(f).metadata
                pq.write_table(pq.read_table(f), crc, write_page_checksum=True,
                               row_group_size=md.row_group(0).num_rows)
                client.upload_file(str(crc), "bench-objects", f"crc/{f.name}")
            runs: dict[str, list[dict]] = {"unchecked": [], "checked": []}
            for _ in range(a.repeats):
                for name, prefix in (("unchecked", "plain"), ("checked", "crc")):
                    out = Path(tmp) / f"{name}.parquet"
                    out.unlink(missing_ok=True)
                    r = measure([sys.executable, "-m", "mrt_fast.cli", "select", f"s3://bench-objects/{prefix}",
                                 str(out), "--k", "4"], env)
                    r.pop("output_tail", None)
                    runs[name].append(r)
                    print(f"   {name}: {r['seconds']:.2f} s", flush=True)
            same = pq.read_table(Path(tmp) / "checked.parquet").equals(pq.read_table(Path(tmp) / "unchecked.parquet"))
    finally:
        srv.stop()
    diffs = [c["seconds"] - u["seconds"] for c, u in zip(runs["checked"], runs["unchecked"])]
    mean, lo, hi = t_interval(diffs)
    med = {k: float(np.median([r["seconds"] for r in v])) for k, v in runs.items()}
    doc = {"candidates": size, "dim": 32, "dtype": "float16", "files": 8, "rounds": a.repeats, "machine": machine(),
           "date": time.strftime("%Y-%m-%d"), "seconds": med,
           "runs_seconds": {k: [r["seconds"] for r in v] for k, v in runs.items()},
           "peak_rss_bytes": {k: max(r["peak_rss_bytes"] for r in v) for k, v in runs.items()},
           "paired_difference_seconds": {"mean": mean, "ci95": [lo, hi], "each": diffs},
           "checked_over_unchecked": med["checked"] / med["unchecked"], "same_kept_rows": bool(same)}
    write_result(a.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
