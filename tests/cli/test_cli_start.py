"""What `mrt select` loads: only what moving Arrow buffers to the core needs."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import polars as pl
import pytest


@pytest.mark.parametrize("dtype", [pl.Float32, pl.Float16])
def test_select_loads_no_compute_kernels_validators_or_pandas(tmp_path, dtype):
    """A whole `mrt select` (a Parquet file in memory, GRADES, a Parquet file out) runs without
    loading `pyarrow.compute`, pydantic or pandas, which it does not need."""
    rng = np.random.default_rng(0)
    n = 400
    pl.DataFrame({"prompt_id": np.arange(n) // 8, "reward": rng.random(n),
                  "embedding": pl.Series(rng.standard_normal((n, 6)).astype(np.float32)).cast(pl.List(dtype))}
                 ).write_parquet(tmp_path / "in.parquet")
    code = ("import sys\nfrom mrt_fast.cli import app\n"
            "try:\n    app(['select', sys.argv[1], sys.argv[2], '--k', '2'])\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "print(sorted(m for m in ('pyarrow.compute', 'pydantic', 'pandas') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "in.parquet"), str(tmp_path / "out.parquet")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"
    assert pl.read_parquet(tmp_path / "out.parquet").height == 2 * (n // 8)


def test_the_command_line_loads_without_numpy():
    """Importing the command line (what `mrt --help` loads) does not import NumPy, so the `mrt` process
    sets how OpenBLAS's threads wait before NumPy starts them."""
    code = ("import sys, os\nimport mrt_fast.cli\nprint('numpy' in sys.modules)\n"
            "from mrt_fast.cli.process import main\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


END = """
import atexit, sys, threading, time, weakref
from pathlib import Path
from mrt_fast.cli.process import end
out = Path(sys.argv[1])
class Held: pass
held = Held()
atexit.register(lambda: (out / "atexit").write_text("ran"))
weakref.finalize(held, lambda: (out / "finalize").write_text("ran"))
if sys.argv[2] == "thread":
    threading.Thread(target=lambda: (time.sleep(0.5), (out / "thread").write_text("done"))).start()
sys.stdout.write("x" * 200_000)  # more than a pipe holds
sys.stdout.write("tail")  # less than the stream's buffer, no newline: still buffered at the end
sys.stderr.write("partial line on stderr")
end(None if sys.argv[3] == "none" else (int(sys.argv[3]) if sys.argv[3].isdigit() else sys.argv[3]))
print("not reached")
"""


@pytest.mark.parametrize(("how", "code", "status"), [("plain", "0", 0), ("plain", "3", 3), ("plain", "none", 0),
                                                     ("plain", "message", 1), ("thread", "2", 2)])
def test_the_process_ends_with_its_code_its_output_and_its_exit_handlers(tmp_path, how, code, status):
    """The `mrt` process's end keeps what an ordinary exit keeps: the code, everything written to stdout and
    stderr, the `atexit` and `weakref.finalize` callbacks, and a non-daemon thread's work; a message as the
    code goes to stderr with status 1."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # the streams keep a buffer
    r = subprocess.run([sys.executable, "-c", END, str(tmp_path), how, code], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == status, r.stderr
    assert r.stdout == "x" * 200_000 + "tail"
    assert r.stderr.startswith("partial line on stderr")
    assert code != "message" or r.stderr.rstrip().endswith("message")
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "finalize").read_text() == "ran"
    assert how != "thread" or (tmp_path / "thread").read_text() == "done"


def test_the_mrt_script_writes_its_output_and_exits_with_the_command_code(tmp_path):
    """`python -m mrt_fast.cli select` (the path the `mrt` script takes) writes the kept rows and its report,
    and a refused input ends it with code 2 and one error line."""
    rng = np.random.default_rng(1)
    n = 240
    pl.DataFrame({"prompt_id": np.arange(n) // 6, "reward": rng.random(n),
                  "embedding": pl.Series(rng.standard_normal((n, 5)).astype(np.float32))}
                 ).write_parquet(tmp_path / "in.parquet")
    cmd = [sys.executable, "-m", "mrt_fast.cli", "select", str(tmp_path / "in.parquet"), str(tmp_path / "out.parquet"),
           "--k", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"wrote {2 * (n // 6)} rows" in r.stdout
    assert pl.read_parquet(tmp_path / "out.parquet").height == 2 * (n // 6)
    cmd[4] = str(tmp_path / "missing.parquet")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error:") and len(r.stderr.strip().splitlines()) == 1
