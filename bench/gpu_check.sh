#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py) on a machine with CUDA, torch and transformers already installed
# and NO network: one H200 with torch 2.11 (CUDA 13) and transformers 5.17 is what it was written for.
#
#   bash bench/gpu_check.sh 2>&1 | tee gpu_check.log       # on the GPU machine, from anywhere
#   BUDGET=300 bash bench/gpu_check.sh --only packed        # a shorter run, one section
#
# Before: run bench/gpu_check_wheels.sh on a machine with PyPI, and copy bench/wheels/ along with the tree
# (with this workplace's device tool: carry ["bench/wheels"]). The wheels (omegaconf, math-verify and
# their pure-Python dependencies, ~0.7 MB) go into a private folder on PYTHONPATH; nothing installed on the
# machine is touched (no torch reinstall), and verirl itself runs from src/ (no pip install).
# BUDGET (seconds, default 450) is a hard limit on the whole check.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
SITE=${GPU_CHECK_SITE:-/tmp/verirl-gpu-check-site}
missing=$("$PY" - <<'PYEOF'
import importlib.util
print(" ".join(m for m in ("omegaconf", "math_verify", "latex2sympy2_extended", "antlr4") if importlib.util.find_spec(m) is None))
PYEOF
)
if [ -n "$missing" ]; then
    if ! ls bench/wheels/*.whl >/dev/null 2>&1; then
        echo "gpu_check: missing Python packages ($missing) and no bench/wheels/*.whl to install them from;" \
             "run bench/gpu_check_wheels.sh where PyPI is reachable and copy bench/wheels/ here." >&2
        exit 2
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        bench/wheels/*.whl || exit 2
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    echo "gpu_check: installed into $SITE (not site-packages): $(ls bench/wheels | tr '\n' ' ')"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
timeout --signal=INT --kill-after=20 "${BUDGET:-450}" "$PY" bench/gpu_check.py "$@"
rc=$?
[ $rc -eq 124 ] && echo "gpu_check: stopped at the ${BUDGET:-450} s budget; the sections above it are complete" >&2
exit $rc
