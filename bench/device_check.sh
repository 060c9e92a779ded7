#!/usr/bin/env bash
# First contact with a lent GPU: one command, within 8 minutes, that returns its numbers whatever happens.
#
#   bash bench/device_check.sh                 # on the device machine (OUT set by its tool): < 8 minutes
#   DRY_RUN=1 OUT=/tmp/dc bash bench/device_check.sh    # anywhere (CPU): every step in its tiny or skip form
#   bash bench/device_check.sh --dry-run       # the same
#
# Each step runs under its own `timeout`, writes its log (and its tables) under $OUT as it goes and adds
# one line to $OUT/summary.txt when it ends: `name rc=N seconds  last line of its log`. rc 124 / 137: the
# step was killed at its limit (what it wrote is kept). Nothing is packed at the end: a call cut short
# returns every step that ended and the partial output of the one that was running. In order:
#
#   cuda       CUDA usable (a matmul on the device) and the device-to-device copy bandwidth; if not: one
#              line in the summary and exit 1 (the dry run notes it and goes on)
#   host_syncs host syncs per steady-state step of the real step, K = 1 and 8, crop + flip and AutoAugment
#              + CutMix, under CUDA's sync debug mode (the fake device predicts 0), the logits' dtype
#              (bench/host_syncs.py --cuda)
#   suite      bench/gpu_suite.py --only probe,compile: the SDPA kernel that actually ran (from the aten op
#              the dispatcher chose), syncs and logits dtype again (K = 1 and 8), then eager against
#              compiled K = 1 and K = 8 images/s with peak memory, and eager K = 8 without the Linear
#              fold (the compile in a child killed at its own bound); suite/gpu_suite.json, rewritten
#              after each section and each compile row
#   snapshot   one snapshot measurement timed (study_l model, 10,000 images, the attention passes): what
#              gpu_study_l's allowance for its snapshots should be (snapshot/snapshot_timing.json)
#   study_l    bench/gpu_study_l.py for two epochs, its training split sized from the numbers above
#              (eager K = 8 images/s, the timed snapshot) to the time left; needs the cifar10-jpeg archive
#              at $DATA_TGZ (default .gpu-data/cifar10-jpeg.tar.gz, carried along), unpacked in the
#              background while the other steps run; tables under study_l/results/ as they are written
#
# The machine's Python has torch, torchvision, numpy, pandas and pyarrow but no Ray, MLflow or Optuna:
# every step is `PYTHONPATH=. python3 bench/...`, none of which imports them (tests/test_device_check.py
# runs the dry run with those three made unimportable).
set -u
if [ -n "${OUT:-}" ] && [ "${OUT#/}" = "$OUT" ]; then OUT="$PWD/$OUT"; fi  # relative to where it was called
cd "$(dirname "$0")/.."

DRY=0
if [ "${DRY_RUN:-0}" != 0 ] || [ "${1:-}" = "--dry-run" ]; then DRY=1; fi
OUT=${OUT:-$PWD/bench/out/device_check}
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-480}  # 8 minutes of the 10-minute call limit: the rest is margin for the tool
DATA_TGZ=${DATA_TGZ:-.gpu-data/cifar10-jpeg.tar.gz}
SCRATCH=$(mktemp -d /tmp/device_check.XXXXXX)  # checkpoints and the unpacked archive: never under $OUT
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }

# step NAME LIMIT_S CMD...: CMD under `timeout`, its stdout and stderr in $OUT/NAME.log, one summary line.
step() {
    local name=$1 limit=$2 t0 rc last
    shift 2
    t0=$(date +%s)
    echo "[$(elapsed) s] $name (limit ${limit} s): $*" | tee -a "$OUT/steps.log"
    timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    last=$(grep -v '^\s*$' "$OUT/$name.log" | tail -n 1 | cut -c1-160)
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then last="killed at its ${limit} s limit; last line: $last"; fi
    printf '%-10s rc=%-3s %4ss  %s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$last" >> "$SUMMARY"
    return "$rc"
}

# skip NAME WHY: a step that does not run here, with its reason (rc=0: nothing failed).
skip() {
    echo "skipped: $2" > "$OUT/$1.log"
    printf '%-10s rc=%-3s %4ss  %s\n' "$1" 0 0 "skipped: $2" >> "$SUMMARY"
}

# 1. CUDA, first: everything after needs it.
CUDA_CHECK='
import sys, time, torch
if not torch.cuda.is_available():
    print(f"CUDA unusable: torch {torch.__version__} sees no CUDA device"); sys.exit(1)
x = torch.randn(1024, 1024, device="cuda"); (x @ x).sum().item()
src = torch.empty(2**30, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src); dst.copy_(src)
torch.cuda.synchronize(); t0 = time.perf_counter()
for _ in range(10): dst.copy_(src)
torch.cuda.synchronize(); gbps = 2 * 10 * 2**30 / (time.perf_counter() - t0) / 1e9
print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB; copy {gbps:,.0f} GB/s (read + write)")'
if [ "$DRY" = 1 ]; then
    # skip form: torch is there (not imported: the next steps import it anyway)
    step cuda 60 "$PY" -c "import importlib.util as u; assert u.find_spec('torch'), 'no torch'; print('dry run: CUDA not checked')"
elif ! step cuda 60 "$PY" -c "$CUDA_CHECK"; then
    echo "CUDA unusable, stopped: $(tail -n 1 "$SUMMARY")"
    rm -rf "$SCRATCH"
    exit 1
fi

# The archive unpacks on the host's CPUs while the GPU steps run.
DATA_ROOT=""
if [ "$DRY" = 0 ] && [ -f "$DATA_TGZ" ]; then
    (tar xzf "$DATA_TGZ" -C "$SCRATCH" > "$OUT/untar.log" 2>&1; echo "rc=$?" >> "$OUT/untar.log") &
    UNTAR=$!
    DATA_ROOT="$SCRATCH/cifar10-jpeg"
fi

# 2-4. The device's numbers.
if [ "$DRY" = 1 ]; then
    step host_syncs 120 "$PY" bench/host_syncs.py --cuda --tiny
    step suite 120 env OUT="$OUT/suite" "$PY" bench/gpu_suite.py --tiny --only probe,compile --section-s 0.05
    step snapshot 60 "$PY" bench/gpu_study_l.py --tiny --time-snapshot --out "$OUT/snapshot"
else
    step host_syncs 90 "$PY" bench/host_syncs.py --cuda
    step suite 230 env OUT="$OUT/suite" "$PY" bench/gpu_suite.py --only probe,compile --deadline-s 220 \
        --compile-bound-s 180
    step snapshot 60 "$PY" bench/gpu_study_l.py --time-snapshot --out "$OUT/snapshot"
fi

# 5. Study L for two epochs, sized from the numbers above to the time left.
# The measured rate and snapshot time as gpu_study_l options; one missing leaves gpu_study_l's default.
SIZING=$("$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out, options = Path(sys.argv[1]), []
try:  # the eager pack of 8: gpu_study_l trains its 4 members eager
    compile_rows = json.loads((out / "suite" / "gpu_suite.json").read_text())["sections"]["compile"]
    options += ["--images-per-s", str(float(compile_rows["eager K=8"]["images_per_s"]))]
except (OSError, KeyError, TypeError, ValueError):
    pass
try:
    timing = json.loads((out / "snapshot" / "snapshot_timing.json").read_text())
    options += ["--snapshot-s", str(float(timing["snapshot_s"]))]
except (OSError, KeyError, TypeError, ValueError):
    pass
print(" ".join(options))
EOF
)
echo "study_l sizing: ${SIZING:-the defaults of gpu_study_l}" >> "$OUT/steps.log"
LEFT=$(( BUDGET_S - $(elapsed) - 15 ))
CODE_VERSION=$(cat .gpu-data/commit 2>/dev/null || echo unknown)
if [ "$DRY" = 1 ]; then
    # shellcheck disable=SC2086  # SIZING: options split on purpose
    step study_l 120 "$PY" bench/gpu_study_l.py --tiny --epochs 2 --budget-s 120 $SIZING \
        --out "$OUT/study_l/results" --storage "$SCRATCH/storage" --code-version "$CODE_VERSION"
elif [ -z "$DATA_ROOT" ]; then
    skip study_l "no archive at $DATA_TGZ (carry .gpu-data with cifar10-jpeg.tar.gz)"
else
    wait "$UNTAR"
    LEFT=$(( BUDGET_S - $(elapsed) - 15 ))
    if ! grep -q '^rc=0$' "$OUT/untar.log"; then
        skip study_l "the archive did not unpack: $(head -c 200 "$OUT/untar.log")"
    elif [ "$LEFT" -lt 90 ]; then
        skip study_l "only $LEFT s left of the ${BUDGET_S} s budget"
    else
        # gpu_study_l sizes its split to budget-s; the timeout, 10 s past it, is the hard stop
        # shellcheck disable=SC2086  # SIZING: options split on purpose
        step study_l "$(( LEFT + 10 ))" "$PY" bench/gpu_study_l.py --data-root "$DATA_ROOT" --epochs 2 \
            --budget-s "$LEFT" $SIZING --out "$OUT/study_l/results" --storage "$SCRATCH/storage" \
            --code-version "$CODE_VERSION"
    fi
fi

rm -rf "$SCRATCH"
echo "device_check done in $(elapsed) s$([ "$DRY" = 1 ] && echo ' (dry run)'); $SUMMARY:"
cat "$SUMMARY"
