#!/usr/bin/env bash
# Install what the tests need into .venv and run the whole suite (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
python -m pip install -q torch==2.13.0 triton==3.9.0
python -m pip install -q -e ".[gpu,test]"
python -m pytest -q "$@"
