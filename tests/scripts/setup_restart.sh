#!/usr/bin/env bash
# Issue 12 item 14: Ctrl-C while `make` creates the venv must not break later `make`s.
# A clean clone of this checkout's HEAD with the checkout's Makefile and pyproject.toml (so that an
# uncommitted change to the set-up is what gets tried); `make setup` interrupted with SIGINT after a few seconds
# (while the venv is being created, or pip is installing), then `make setup` again must finish.
# Usage: tests/scripts/setup_restart.sh [SECONDS_BEFORE_CTRL_C ...]   (default: 1 3 8)
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
for t in "${@:-1 3 8}"; do
  for delay in $t; do
    cd "$work" && rm -rf "$work/clone"
    git clone -q "$repo" "$work/clone"
    cd "$work/clone"
    cp "$repo/Makefile" "$repo/pyproject.toml" .
    timeout -s INT "$delay" make setup >/dev/null 2>&1
    state="$( [ -d .venv ] && echo "venv present" || echo "no venv" ), pip $( .venv/bin/python -m pip --version >/dev/null 2>&1 && echo works || echo broken )"
    if make setup >/dev/null 2>&1 && .venv/bin/python -c "import verirl.cli" 2>/dev/null; then
      echo "Ctrl-C after ${delay}s ($state): the next make setup finished, verirl imports"
    else
      echo "Ctrl-C after ${delay}s ($state): the next make setup FAILED"; status=1
    fi
  done
done
exit $status
