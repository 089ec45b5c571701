"""Every command on missing, unreadable, corrupt and empty inputs and on bad output locations.

Each fault must end the command with exit code 2 and one line on stderr, before
any work (no model is loaded: the model given is a path that does not exist, so
reaching it would be a different error), and must leave no file behind.
"""

import os
import stat
import sys

import polars as pl
import pytest
from typer.testing import CliRunner

from mrt_fast.cli import app

runner = CliRunner()
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def good_table(path):
    pl.DataFrame({"prompt_id": ["a", "b"], "prompt": ["Say hi.", "Say bye."], "response": ["hi", "bye"],
                  "reference": ["hi", "bye"]}).write_parquet(path)
    return path


def argv(cmd, inp, out, model):
    """The command line of `cmd` reading `inp` and writing `out`."""
    return {
        "nll": ["nll", inp, out, "--model", model],
        "score": ["score", inp, out, "--model", model],
        "generate": ["generate", inp, out, "--model", model, "--n", "2"],
        "train": ["train", inp, out, "--model", model],
        "evaluate": ["evaluate", inp, "--model", model, "--out", out],
    }[cmd]


OUT_NAME = {"nll": "out.parquet", "score": "out.parquet", "generate": "out.parquet", "train": "run",
            "evaluate": "metrics.json"}
TABLE_COMMANDS = list(OUT_NAME)


def one_line_exit_2(r, *needles):
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    err = r.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    for n in needles:
        assert n in err, (n, err)


def listing(d):
    return sorted(p.name for p in d.iterdir())


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


# ------------------------------------------------------------------ inputs


def _missing(p):
    return p, "does not exist"


def _directory(p):
    p = p.with_suffix(".parquet")
    p.mkdir()
    return p, "not a file"


def _corrupt(p):
    p.write_bytes(b"PAR1 this is not parquet at all \x00\x01\x02")
    return p, "cannot read"


def _zero_bytes(p):
    p.write_bytes(b"")
    return p, "cannot read"


def _no_rows(p):
    pl.DataFrame({"prompt_id": [], "prompt": [], "response": [], "reference": []},
                 schema={c: pl.Utf8 for c in ("prompt_id", "prompt", "response", "reference")}).write_parquet(p)
    return p, "has no rows"


def _no_columns(p):
    pl.DataFrame({"x": [1, 2]}).write_parquet(p)
    return p, "not found"


def _bad_suffix(p):
    p = p.with_suffix(".xlsx")
    p.write_bytes(b"x")
    return p, "unsupported format"


def _corrupt_jsonl(p):
    p = p.with_suffix(".jsonl")
    p.write_text('{"prompt_id": "a", "prompt": "x", "response": "y", "reference": "y"}\n{"prompt_id": \n')
    return p, "cannot read"


INPUT_FAULTS = [_missing, _directory, _corrupt, _zero_bytes, _no_rows, _no_columns, _bad_suffix, _corrupt_jsonl]


@pytest.mark.parametrize("fault", INPUT_FAULTS, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("cmd", TABLE_COMMANDS)
def test_bad_input_is_one_line_exit_2(tmp_path, cmd, fault):
    inp, needle = fault(tmp_path / "in.parquet")
    if fault is _directory and cmd in ("nll", "score", "export"):
        needle = "matches no .parquet/.jsonl file"  # these read directories of tables (an mrt output) too
    outdir = tmp_path / "o"
    outdir.mkdir()
    r = invoke(*argv(cmd, inp, outdir / OUT_NAME[cmd], tmp_path / "no-model"))
    one_line_exit_2(r, needle)
    assert listing(outdir) == []


@pytest.mark.skipif(ROOT, reason="root reads any file")
@pytest.mark.parametrize("cmd", TABLE_COMMANDS)
def test_unreadable_input_is_one_line_exit_2(tmp_path, cmd):
    inp = good_table(tmp_path / "in.parquet")
    inp.chmod(0)
    r = invoke(*argv(cmd, inp, tmp_path / OUT_NAME[cmd], tmp_path / "no-model"))
    one_line_exit_2(r, "not readable")


# ------------------------------------------------------------------ outputs


@pytest.mark.parametrize("cmd", ["nll", "score", "generate", "evaluate"])
def test_output_in_missing_directory_is_made_only_when_written(tmp_path, cmd):
    inp = good_table(tmp_path / "in.parquet")
    out = tmp_path / "nowhere" / "deeper" / OUT_NAME[cmd]
    r = invoke(*argv(cmd, inp, out, tmp_path / "no-model"))  # the missing model is the one error
    one_line_exit_2(r, "no-model")
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("cmd", ["nll", "score", "evaluate"])
def test_output_under_a_file_fails_before_work(tmp_path, cmd):
    inp = good_table(tmp_path / "in.parquet")
    (tmp_path / "plain.txt").write_text("x")
    r = invoke(*argv(cmd, inp, tmp_path / "plain.txt" / OUT_NAME[cmd], tmp_path / "no-model"))
    one_line_exit_2(r, "not a directory", "plain.txt")


@pytest.mark.parametrize("cmd", ["nll", "score", "generate"])
def test_output_that_is_a_directory_or_bad_format_fails_before_work(tmp_path, cmd):
    inp = good_table(tmp_path / "in.parquet")
    d = tmp_path / "out.parquet"
    d.mkdir()
    if cmd == "generate":  # nll and score write a dataset into a directory (the job's rule)
        one_line_exit_2(invoke(*argv(cmd, inp, d, tmp_path / "no-model")), "is a directory")
    one_line_exit_2(invoke(*argv(cmd, inp, tmp_path / "out.xlsx", tmp_path / "no-model")), "unsupported format")
    assert listing(tmp_path) == ["in.parquet", "out.parquet"]


@pytest.mark.parametrize("cmd", ["train"])
def test_output_directory_under_a_file_fails_before_work(tmp_path, cmd):
    inp = good_table(tmp_path / "in.parquet")
    f = tmp_path / "plain.txt"
    f.write_text("x")
    one_line_exit_2(invoke(*argv(cmd, inp, f, tmp_path / "no-model")), "not a directory")
    one_line_exit_2(invoke(*argv(cmd, inp, f / "run", tmp_path / "no-model")), "not a directory")


@pytest.mark.skipif(ROOT, reason="root writes anywhere")
@pytest.mark.parametrize("cmd", TABLE_COMMANDS)
def test_unwritable_output_location_fails_before_work(tmp_path, cmd):
    inp = good_table(tmp_path / "in.parquet")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        r = invoke(*argv(cmd, inp, ro / OUT_NAME[cmd], tmp_path / "no-model"))
        one_line_exit_2(r)
        assert "no-model" not in r.stderr
    finally:
        ro.chmod(0o755)


@pytest.mark.parametrize("cmd,opt", [("simulate", "--out"), ("demo", "--out-dir")])
def test_output_folder_faults_of_simulate_and_demo(tmp_path, cmd, opt):
    f = tmp_path / "plain.txt"
    f.write_text("x")
    one_line_exit_2(invoke(cmd, opt, f), "not a directory")
    one_line_exit_2(invoke(cmd, opt, f / "sub"), "not a directory")
    assert listing(tmp_path) == ["plain.txt"]


def test_bad_numbers_are_one_line_exit_2(tmp_path):
    inp = good_table(tmp_path / "in.parquet")
    one_line_exit_2(invoke("demo", "--k", "0", "--out-dir", tmp_path / "d"), "k must be")
    one_line_exit_2(invoke("simulate", "--threads", "0", "--out", tmp_path / "s"), "--threads")
    one_line_exit_2(invoke("nll", inp, tmp_path / "o.parquet", "--batch-size", "0"), "--batch-size")
    one_line_exit_2(invoke("score", inp, tmp_path / "o.parquet", "--model", "m", "--batch-size", "0"), "--batch-size")
    one_line_exit_2(invoke("generate", inp, tmp_path / "o.parquet", "--model", "m", "--n", "0"), "n must be")
    assert listing(tmp_path) == ["in.parquet"]


def test_nll_refuses_an_existing_loss_column_and_null_text(tmp_path):
    inp = tmp_path / "in.parquet"
    pl.DataFrame({"prompt": ["a"], "response": ["b"], "loss": [1.0]}).write_parquet(inp)
    one_line_exit_2(invoke("nll", inp, tmp_path / "o.parquet", "--model", tmp_path / "no-model"), "'loss'")
    pl.DataFrame({"prompt": ["a", "b"], "response": ["b", None]}).write_parquet(inp)
    one_line_exit_2(invoke("nll", inp, tmp_path / "o.parquet", "--model", tmp_path / "no-model"), "row 1")
    # the input and output are fine: the missing model is the one error
    pl.DataFrame({"prompt": ["a"], "response": ["b"]}).write_parquet(inp)
    one_line_exit_2(invoke("nll", inp, tmp_path / "o.parquet", "--model", tmp_path / "no-model"), "no-model")
    assert listing(tmp_path) == ["in.parquet"]


@pytest.mark.train
@pytest.mark.slow
@pytest.mark.parametrize("cmd", ["score", "generate", "train", "evaluate"])
def test_missing_model_is_one_line_exit_2(tmp_path, cmd):
    inp = good_table(tmp_path / "in.parquet")
    outdir = tmp_path / "o"
    outdir.mkdir()
    r = invoke(*argv(cmd, inp, outdir / OUT_NAME[cmd], tmp_path / "no-model"))
    one_line_exit_2(r)
    assert listing(outdir) == []


# ------------------------------------------------------------------ a full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs (root only) and a way to leave only ``free`` bytes of it (a ballast file)."""
    import subprocess

    if not ROOT:
        pytest.skip("mounting a small file system needs root")
    d = tmp_path / "disk"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(d)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    ballast = d / "ballast"

    def leave(free):
        ballast.unlink(missing_ok=True)
        st = os.statvfs(d)
        fill = st.f_bavail * st.f_frsize - free
        if fill > 0:
            with open(ballast, "wb") as fh:
                os.posix_fallocate(fh.fileno(), 0, fill)

    try:
        yield d, leave
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def pools_table(d, n=20_000, dim=64, seed=0):
    """Pools of 5 to 25 candidates with 64-d embeddings, shuffled over two Parquet files (about 5.5 MB)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(n), rng.integers(5, 26, n))[:n]
    df = pl.DataFrame({"prompt_id": ids, "reward": rng.standard_normal(n),
                       "embedding": rng.standard_normal((n, dim), dtype=np.float32)})
    df = df.with_columns(pl.col("embedding").cast(pl.List(pl.Float32))).sample(fraction=1.0, shuffle=True, seed=seed)
    d.mkdir()
    df.slice(0, n // 2).write_parquet(d / "a.parquet")
    df.slice(n // 2).write_parquet(d / "b.parquet")
    return d


def kept_rows(out):
    df = pl.read_parquet(out) if out.suffix else pl.read_parquet(out / "*.parquet")
    return df.sort("prompt_id", "pick_rank")


@pytest.mark.parametrize("case, out_name, free, extra, needle", [
    ("a part", "kept", 64 << 10, [], "while writing part 0 to"),
    ("the spill", "kept", 1 << 20, ["--chunk-rows", "4000"], "while spilling the input"),
    ("the spill of a file output", "kept.parquet", 1 << 20, ["--chunk-rows", "4000"], "while spilling the input"),
    ("a file output", "kept.parquet", 64 << 10, [], "while writing to"),
])
def test_full_disk_is_one_line_and_a_rerun_finishes(tmp_path, small_disk, case, out_name, free, extra, needle):
    """A full disk names what was written where and the room left (exit 2, no traceback, not blamed
    on the input); after space is freed the same command finishes with the rows of a clean run."""
    disk, leave = small_disk
    src = pools_table(tmp_path / "in")
    args = ["select", src, disk / out_name, "--k", "3", *extra]
    leave(free)
    r = invoke(*args)
    one_line_exit_2(r, "no space left on device", needle, str(disk), "bytes free", "rerun the same command")
    assert "cannot read" not in r.stderr and str(src) not in r.stderr
    leave(14 << 20)
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    assert invoke("select", src, tmp_path / out_name, "--k", "3").exit_code == 0
    assert kept_rows(disk / out_name).equals(kept_rows(tmp_path / out_name))
    # no temp file or spill left behind (the .mrt/ folder is the finished dataset's manifest)
    assert not [p for p in disk.rglob("*") if (p.name.startswith(".") and p.name != ".mrt") or p.name == "_spill"]


# ------------------------------------------------------------------ and the commands still work


@pytest.mark.train
@pytest.mark.slow
def test_llm_commands_run_end_to_end(tmp_path):
    """generate -> score -> nll -> train -> evaluate on tiny offline models, through the CLI."""
    import json

    from mrt_fast.llm.testing import save_tiny_models, tiny_prompt_table

    paths = save_tiny_models(tmp_path / "models")
    lm, rm = str(paths["lm"]), str(paths["reward"])
    tiny_prompt_table(2, with_reference=False).write_parquet(tmp_path / "prompts.parquet")
    tiny_prompt_table(2, offset=5).write_ndjson(tmp_path / "eval.jsonl")
    ok = lambda r: r.exit_code == 0 or pytest.fail(f"{r.exit_code}: {r.output} {r.exception!r}")  # noqa: E731
    ok(invoke("generate", tmp_path / "prompts.parquet", tmp_path / "cands.parquet", "--model", lm, "--n", "2",
              "--max-new-tokens", "4", "--backend", "transformers"))
    cands = pl.read_parquet(tmp_path / "cands.parquet")
    assert cands.height == 4
    ok(invoke("score", tmp_path / "cands.parquet", tmp_path / "scored.jsonl", "--model", rm))
    scored = pl.read_ndjson(tmp_path / "scored.jsonl")
    assert scored.height == 4 and scored["reward"].is_finite().all()
    ok(invoke("nll", tmp_path / "scored.jsonl", tmp_path / "nll.csv", "--model", lm))
    assert pl.read_csv(tmp_path / "nll.csv")["loss"].is_finite().all()
    ok(invoke("train", tmp_path / "cands.parquet", tmp_path / "run", "--model", lm, "--max-steps", "1"))
    assert (tmp_path / "run" / "adapter").is_dir()
    ok(invoke("evaluate", tmp_path / "eval.jsonl", "--model", lm, "--adapter", tmp_path / "run" / "adapter",
              "--embedder", "hashing", "--out", tmp_path / "metrics.json", "--set", "n_samples=2",
              "--set", "max_new_tokens=4"))
    assert "ref_loss" in json.loads((tmp_path / "metrics.json").read_text())
    assert not [p for p in tmp_path.rglob(".*.tmp")]


def test_generate_refuses_a_corrupt_settings_file_of_an_earlier_run(tmp_path):
    inp = good_table(tmp_path / "in.parquet")
    parts = tmp_path / "out.parquet.parts"
    parts.mkdir()
    (parts / "meta.json").write_text('{"n": 2, "temp')  # cut by a kill
    r = invoke("generate", inp, tmp_path / "out.parquet", "--model", tmp_path / "no-model", "--n", "2")
    one_line_exit_2(r, "meta.json")
    assert (parts / "meta.json").exists()


def test_help_and_a_one_line_error_import_no_heavy_stack(tmp_path):
    """`mrt --help` and a bad-input error load neither pandas, torch, ray, transformers, faiss,
    matplotlib nor pyarrow's dataset layer: a user waits only on what the command needs."""
    import subprocess
    import sys

    code = ("import sys\nfrom mrt_fast.cli import app\n"
            "for argv in (['--help'], ['select', sys.argv[1], sys.argv[2], '--k', '2']):\n"
            "    try:\n        app(argv)\n    except SystemExit:\n        pass\n"
            "heavy = {'pandas', 'torch', 'ray', 'transformers', 'faiss', 'sentence_transformers', 'matplotlib',"
            " 'scipy', 'datasets', 'pyarrow.dataset'}\n"
            "print('HEAVY', sorted(heavy & set(sys.modules)))\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "missing.parquet"), str(tmp_path / "o.parquet")],
                       capture_output=True, text=True)
    assert "HEAVY []" in r.stdout, r.stdout + r.stderr
    assert "does not exist" in r.stderr or "does not exist" in r.stdout


def test_help_loads_neither_polars_nor_numpy():
    """`mrt --help` and every command's help need only the command line: the CLI reads the kernel
    default from a module of no imports, not from the selection area."""
    import subprocess
    import sys

    code = ("import sys\nfrom mrt_fast.cli import app\n"
            "for argv in (['--help'], ['select', '--help'], ['diagnose', '--help'], ['answers', '--help']):\n"
            "    try:\n        app(argv)\n    except SystemExit:\n        pass\n"
            "print('HEAVY', sorted({'polars', 'numpy', 'pyarrow'} & set(sys.modules)))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "HEAVY []" in r.stdout, r.stdout[-500:] + r.stderr


@pytest.mark.parametrize("parts", [None, 3], ids=["in-memory", "spilled"])
def test_a_select_job_loads_no_pandas(tmp_path, parts):
    """`mrt select` over Parquet files (read whole, or spilled into buckets) never loads pandas,
    pyarrow's dataset layer, scipy or matplotlib: a small job pays only for what it does."""
    import subprocess
    import sys

    import numpy as np

    rng = np.random.default_rng(0)
    n = 4000
    for j in range(2):
        pl.DataFrame({"prompt_id": rng.integers(0, 200, n), "reward": rng.standard_normal(n),
                      "embedding": rng.standard_normal((n, 8)).astype(np.float32).tolist()}
                     ).write_parquet(tmp_path / f"in-{j}.parquet")
    argv = ["select", str(tmp_path / "in-*.parquet"), str(tmp_path / "out"), "--k", "2"]
    if parts:
        argv += ["--parts", str(parts)]
    code = ("import sys, json\nfrom mrt_fast.cli import app\n"
            "try:\n    app(json.loads(sys.argv[1]))\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "heavy = {'pandas', 'pyarrow.dataset', 'scipy', 'matplotlib', 'torch', 'ray'}\n"
            "print('HEAVY', sorted(heavy & set(sys.modules)))\n")
    import json

    r = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True)
    assert "HEAVY []" in r.stdout, r.stdout + r.stderr
    assert ("spilled to disk" in r.stdout) == bool(parts), r.stdout
    assert pl.scan_parquet(tmp_path / "out" / "*.parquet").select(pl.len()).collect().item() > 0


@pytest.mark.parametrize("name", ["datasets", "transformers", "huggingface_hub"])
def test_a_library_marked_absent_does_not_break_a_command(tmp_path, monkeypatch, name):
    """`sys.modules[name] = None` marks a library absent (a user's way of blocking it, and the test
    suite's where Hugging Face `datasets` is not installed): a command quiets the libraries it finds
    and runs, instead of failing on the import of the one marked absent."""
    from mrt_fast.cli.quiet import quiet_libraries

    monkeypatch.setitem(sys.modules, name, None)
    quiet_libraries()
    src = tmp_path / "in.parquet"
    pl.DataFrame({"prompt_id": [0, 0, 1, 1], "reward": [1.0, 2.0, 3.0, 4.0]}).write_parquet(src)
    r = CliRunner().invoke(app, ["select", str(src), str(tmp_path / "out"), "--k", "1", "--method", "top"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert pl.read_parquet(tmp_path / "out" / "*.parquet")["reward"].sort().to_list() == [2.0, 4.0]
