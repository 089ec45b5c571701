"""The static tier against sentence-transformers ``encode``, timed in alternating blocks.

On a shared machine the load drifts; timing one path after the other biases
their ratio. Here the same ``--n`` texts (``embed_corpus.mixed_texts``) are cut
into blocks, and each block is embedded by both, which goes first alternating
(static, encode, encode, static, ...). Both models are loaded (the static one
built if needed) before any timing.

    python bench/perf/bench_static_ab.py                 # 3,000 texts, blocks of 1,000
    python bench/perf/bench_static_ab.py --n 6000 --block 2000 --out other.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3_000)
    ap.add_argument("--block", type=int, default=1_000)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cache-dir", default=None, help="where the static model is kept (default: the user cache)")
    ap.add_argument("--out", default=str(HERE.parent / "results" / "static_ab.json"))
    a = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

    import torch

    from embed_corpus import mixed_texts
    from mrt_fast.embeddings.embed import load_model
    from mrt_fast.embeddings.static import load_static

    torch.set_num_threads(a.threads)
    texts = mixed_texts(a.n)
    sm = load_static("static", a.cache_dir, progress=False)
    m = load_model(None, "cpu")
    res: dict = {"n_texts": a.n, "block": a.block, "static_model_id": sm.model_id,
                 "machine": {"cpus": os.cpu_count(), "torch_threads": a.threads, "platform": platform.platform(),
                             "torch": torch.__version__, "load_avg_start": os.getloadavg()}}
    spent = {"static": 0.0, "encode": 0.0}
    for b, s in enumerate(range(0, a.n, a.block)):
        blk = texts[s : s + a.block]
        for which in (("static", "encode") if b % 2 == 0 else ("encode", "static")):
            t0 = time.perf_counter()
            if which == "static":
                sm.encode(blk)
            else:
                m.encode(blk, batch_size=64, normalize_embeddings=True, convert_to_numpy=True,
                         show_progress_bar=False)
            spent[which] += time.perf_counter() - t0
        done = min(s + a.block, a.n)
        print(f"{done}/{a.n}: static {done / spent['static']:.0f}, encode {done / spent['encode']:.1f} texts/s",
              flush=True)
    res["texts_per_second"] = {"static encode (library call)": a.n / spent["static"],
                               "encode (sentence-transformers, MiniLM)": a.n / spent["encode"]}
    res["static_x_encode"] = spent["encode"] / spent["static"]
    res["machine"]["load_avg_end"] = os.getloadavg()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"static {res['static_x_encode']:.0f}x encode; results: {a.out}")


if __name__ == "__main__":
    main()
