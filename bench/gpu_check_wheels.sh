#!/usr/bin/env bash
# Download, HERE (a machine with PyPI), the small pure-Python wheels that bench/gpu_check.sh installs on
# the GPU machine, which has torch, transformers, tokenizers, safetensors, numpy, pyarrow, rich,
# matplotlib, sympy and pyyaml but no network. The versions are the ones .venv runs with.
# They land in bench/wheels/ (keep it out of git: add /bench/wheels/ to .gitignore); copy that folder
# along with the tree (the device tool: carry ["bench/wheels"]). About 19 MB in all.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p bench/wheels
"$PY" -m pip download -q --no-deps --only-binary=:all: -d bench/wheels \
    omegaconf==2.4.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
# pytest and its dependencies, for bench/gpu_all.sh's CUDA-only tests where the GPU machine has no pytest
# (a folder of their own: gpu_check.sh installs only bench/wheels/*.whl)
mkdir -p bench/wheels/test
"$PY" -m pip download -q --no-deps --only-binary=:all: -d bench/wheels/test \
    pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 pygments==2.21.0
# TRL and what it needs beyond the GPU machine's packages, for bench/gpu_all.sh's comparison on the GPU (python
# 3.12 there: binary wheels for cp312; gpu_all.sh installs only the modules the machine lacks). ~16 MB.
mkdir -p bench/wheels/trl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d bench/wheels/trl \
    trl==1.16.0 accelerate==1.15.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0 \
    fsspec==2026.9.0 pandas==3.1.1 psutil==7.2.2 python-dateutil six
ls -lR bench/wheels
du -sh bench/wheels
