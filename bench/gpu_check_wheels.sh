#!/usr/bin/env bash
# Download, HERE (a machine with PyPI), the small pure-Python wheels that bench/gpu_check.sh installs on
# the GPU machine, which has torch, transformers, tokenizers, safetensors, numpy, pyarrow, rich,
# matplotlib, sympy and pyyaml but no network. The versions are the ones .venv runs with.
# They land in bench/wheels/ (keep it out of git: add /bench/wheels/ to .gitignore); copy that folder
# along with the tree (the device tool: carry ["bench/wheels"]). About 0.7 MB in all.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p bench/wheels
"$PY" -m pip download -q --no-deps --only-binary=:all: -d bench/wheels \
    omegaconf==2.4.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
ls -l bench/wheels
du -sh bench/wheels
