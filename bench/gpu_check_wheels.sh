#!/usr/bin/env bash
# Download, HERE (a machine with PyPI), the small pure-Python wheels that bench/gpu_check.sh installs on
# the GPU machine, which has torch, transformers, tokenizers, safetensors, numpy, pyarrow, rich,
# matplotlib, sympy and pyyaml but no network. The versions are the ones .venv runs with.
# They land in bench/wheels/ (keep it out of git: add /bench/wheels/ to .gitignore); copy that folder
# along with the tree (the device tool: carry ["bench/wheels"]). About 2.5 MB in all.
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
ls -lR bench/wheels
du -sh bench/wheels
