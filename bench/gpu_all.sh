#!/usr/bin/env bash
# Every GPU check in one go, for a lent GPU machine with a time limit (no network; bench/wheels carried):
#   1. the CUDA-only tests (pytest from bench/wheels/test if the machine has none),
#   1b. the real varlen kernels (torch's flash kernels direct, varlen_attn, flash-attn where installed) against
#      the buckets on the tiny model in bf16 (tests/test_packing.py::test_cuda_varlen_kernel_equals_buckets),
#   2. bench/gpu_check.sh (GRPO steps, FSDP2 on one rank, packed vs padded),
#   3. the embedded default on the GPU for TRAIN_STEPS steps (the whole trainer: rollout, packing, update),
#   4. bench/gpu_profile.py (packed and decode) while time is left,
#   5. bench/grpo_vs_trl.py on the GPU in bf16, cases E and R, against TRL (its wheels from bench/wheels/trl,
#      installed only where the machine lacks a module).
# Output under $OUT (or ./gpu_out): one log per part. BUDGET (s, default 420) bounds the whole;
# PARTS (default tests,varlen,check,train,profile,trl) picks parts. Without CUDA each GPU part says
# "skipped: no CUDA".
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
BUDGET=${BUDGET:-420}; T0=$(date +%s)
left() { local l=$(( BUDGET - ($(date +%s) - T0) )); echo $(( l < 1 ? 1 : l )); }  # never 0: timeout 0 is no limit
PY=${PY:-python3}
SITE=/tmp/verirl-gpu-all-site; mkdir -p "$SITE"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
else
  echo "no nvidia-smi" | tee "$OUT/machine.txt"
fi
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/machine.txt"
"$PY" -c "import pytest" 2>/dev/null || "$PY" -m pip install -q --no-index --no-deps --target "$SITE" bench/wheels/test/*.whl
compgen -G "bench/wheels/*.whl" >/dev/null && "$PY" -m pip install -q --no-index --no-deps --target "$SITE" bench/wheels/*.whl
export PYTHONPATH="$PWD/src:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

PARTS=${PARTS:-tests,varlen,check,train,profile,trl}
want() { [[ ",$PARTS," == *",$1,"* ]]; }
cuda() { "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }
# TRL and what it needs, where the machine has not got them (module:wheel prefix)
if want trl; then
  for mw in trl:trl accelerate:accelerate datasets:datasets dill:dill multiprocess:multiprocess xxhash:xxhash \
            fsspec:fsspec pandas:pandas psutil:psutil dateutil:python_dateutil six:six; do
    m=${mw%%:*}; w=${mw##*:}
    "$PY" -c "import $m" 2>/dev/null || "$PY" -m pip install -q --no-index --no-deps --target "$SITE" bench/wheels/trl/$w-*.whl
  done
  "$PY" -c "import trl; print('trl', trl.__version__)" 2>&1 | tail -1 | tee -a "$OUT/machine.txt"
fi

if want tests; then
echo "== 1. CUDA tests"
timeout 90 "$PY" -m pytest -q -p no:cacheprovider tests/test_rollout.py tests/test_packing.py tests/test_mixed_precision.py -k "(cuda or fixed_shape or flash_varlen) and not cuda_varlen_kernel" 2>&1 | tail -15 | tee "$OUT/tests.log"

fi
if want varlen; then
echo "== 1b. the varlen kernels against the buckets ($(left) s left)"
if cuda; then
  timeout $(( $(left) < 90 ? $(left) : 90 )) "$PY" -m pytest -q -p no:cacheprovider -rs \
      "tests/test_packing.py::test_cuda_varlen_kernel_equals_buckets" 2>&1 | tail -15 | tee "$OUT/varlen.log"
else
  echo "skipped: no CUDA" | tee "$OUT/varlen.log"
fi

fi
if want check; then
echo "== 2. gpu_check ($(left) s left)"
BUDGET=$(( $(left) < 200 ? $(left) : 200 )) bash bench/gpu_check.sh 2>&1 | tee "$OUT/gpu_check.log" | grep -v "^\s*$" | tail -40

fi
if want train; then
echo "== 3. embedded default on the GPU ($(left) s left)"
timeout $(( $(left) < 150 ? $(left) : 150 )) "$PY" -m verirl.cli train model.device=cuda \
    trainer.total_steps=${TRAIN_STEPS:-200} trainer.run_dir=/tmp/gpu_tiny eval.size=100 log.console_every=50 \
    > "$OUT/train.log" 2>&1; echo "rc=$?"; tail -25 "$OUT/train.log"
cp /tmp/gpu_tiny/summary.json "$OUT/train_summary.json" 2>/dev/null
cp /tmp/gpu_tiny/metrics.jsonl "$OUT/train_metrics.jsonl" 2>/dev/null

fi
if want profile && [ "$(left)" -gt 60 ]; then
  echo "== 4. gpu_profile ($(left) s left)"
  timeout $(( $(left) - 10 )) "$PY" bench/gpu_profile.py 2>&1 | tee "$OUT/profile.log" | tail -60
fi
if want trl && [ "$(left)" -gt 60 ]; then
  echo "== 5. verirl vs TRL on the GPU, bf16 ($(left) s left)"
  timeout $(( $(left) - 5 )) "$PY" bench/grpo_vs_trl.py --device cuda --dtype bfloat16 --cases ${TRL_CASES:-E,R} \
      --steps ${TRL_STEPS:-5} --warmup 2 --json "$OUT/grpo_vs_trl.json" 2>&1 | tee "$OUT/grpo_vs_trl.log" \
      | grep -v -i "warn\|Loading weights" | tail -40
fi
echo "== done in $(( $(date +%s) - T0 )) s"
