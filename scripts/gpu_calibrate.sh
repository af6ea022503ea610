#!/usr/bin/env bash
# The prepared device run (one GPU, at most 8 minutes): calibrate Kimi-Linear-48B-A3B and Llama-3.1-8B at
# --layers unit on a 60 s Mooncake slice (bench/data/mooncake_slice_60s.jsonl, 162 requests, ~2,000 steps each),
# then the kernel benchmark. Everything lands in $OUT (default ./gpu-out):
#
#   versions.txt                    python, torch, triton, fla-core, simpy, GPU name and SM count as run
#   kimi/  llama/                   calibration.json, steps.csv (predicted vs measured per step),
#                                   replay_steps.csv (the schedule; equals `poolsim run`'s steps.csv), report.md,
#                                   calibration.png
#   kimi.log llama.log              the printed figures (fit, MAPE, pool check, wall seconds)
#   kernels_gpu.md/.csv             bench/kernels_gpu.py
#
# Acceptance (issue 13): pool_check.mismatches == 0 in both; fit.mape_heldout <= 0.10 and
# fit.by_kind.decode.mape <= 0.07; wall <= 8 min. (Two runs agreeing within 3 % needs a second run of the same
# command; it does not fit the 8 minutes with both models, so run KIMI_ONLY=1 twice for that check.)
#
# The device has its own, older torch/triton and no fla-core/simpy: prepare the carried wheels here first with
#   scripts/gpu_calibrate.sh --fetch-wheels      (pure-python wheels into ./wheels, a few MiB; carry 'wheels')
#   scripts/gpu_calibrate.sh --fetch-wheels 3.10 (the device's python; adds pandas + matplotlib binary wheels for it)
# and the run installs them with --no-deps into ./.deps (PYTHONPATH), leaving the device's torch/triton alone.
# Keep the carried folder under 64 MiB (du -sh wheels prints it); matplotlib is optional (no plot without it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-gpu-out}
TRACE=bench/data/mooncake_slice_60s.jsonl
# pure-python packages poolsim needs beyond torch/triton/numpy (fla-core 0.6.0 pulls einops)
WHEELS="simpy fla-core==0.6.0 einops typer click rich markdown-it-py mdurl pygments shellingham typing_extensions"

if [ "${1:-}" = "--fetch-wheels" ]; then
    $PY -m pip download --no-deps --only-binary=:all: -d wheels $WHEELS
    if [ -n "${2:-}" ]; then  # binary wheels for the device's python (numpy comes with its torch)
        $PY -m pip download --no-deps --only-binary=:all: -d wheels --python-version "$2" \
            --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
            pandas python-dateutil six pytz tzdata matplotlib pillow kiwisolver contourpy fonttools cycler \
            pyparsing packaging
    fi
    du -sh wheels
    exit 0
fi

mkdir -p "$OUT"
if [ -d wheels ]; then
    $PY -m pip install -q --no-index --no-deps --target .deps wheels/*.whl
    export PYTHONPATH="$PWD/.deps:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
$PY - <<'PYEOF' | tee "$OUT/versions.txt"
import importlib, platform, torch
print("python", platform.python_version())
for m in ("torch", "triton", "fla", "simpy", "numpy", "pandas", "matplotlib"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except ImportError as e:
        print(m, "MISSING", e)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, "sm", p.multi_processor_count, "mem_gib", round(p.total_memory / 2**30, 1), "cuda", torch.version.cuda)
PYEOF
date -u +"start %FT%TZ" | tee -a "$OUT/versions.txt"

run() {  # name, model, seconds of measuring, hard limit
    timeout "$4" $PY cli.py calibrate "$TRACE" --model "$2" --gpu H200 --device cuda:0 --layers unit \
        --budget-s "$3" --out "$OUT/$1" 2>&1 | tee "$OUT/$1.log" || echo "$1: exit $?" | tee -a "$OUT/$1.log"
}
run kimi kimi-linear-48b-a3b 120 200
[ "${KIMI_ONLY:-0}" = 1 ] || run llama llama-3.1-8b 90 160
[ "${KIMI_ONLY:-0}" = 1 ] || OUT="$OUT" timeout 100 $PY bench/kernels_gpu.py --budget-s 80 2>&1 | tail -40 | tee "$OUT/kernels.log" || true
date -u +"end %FT%TZ" | tee -a "$OUT/versions.txt"
