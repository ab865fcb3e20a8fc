#!/usr/bin/env bash
# Virtualenvs for the optimisation-layer peers of the peer benchmark (never used by `make test`):
# .peers/torchopt (TorchOpt 0.7.3) and .peers/theseus (Theseus 0.2.3), each beside torch 2.13.0
# (the CPU build) and this project (editable, no extras). Theseus builds only with SuiteSparse's
# headers (Debian: `apt-get install libsuitesparse-dev`), scikit-sparse 0.4.16 and
# --no-build-isolation. TorchOpt's C++ extension does not load against torch 2.13; that only
# affects its fused Adam, which the benchmark does not use.
set -euo pipefail
PYTHON=${PYTHON:-python3}
ROOT=${PEERS:-.peers}
make_venv() {
  local name=$1
  shift
  test -x "$ROOT/$name/bin/python" || "$PYTHON" -m venv "$ROOT/$name"
  "$ROOT/$name/bin/python" -m pip install -q torch==2.13.0
  "$ROOT/$name/bin/python" -m pip install -q -e . "$@"
}
make_venv torchopt torchopt==0.7.3
if ! test -e /usr/include/suitesparse/cholmod.h; then
  echo "venvs.sh: SuiteSparse headers missing; install libsuitesparse-dev first" >&2
  exit 1
fi
make_venv theseus numpy scipy cython setuptools wheel
"$ROOT/theseus/bin/python" -m pip install -q --no-build-isolation scikit-sparse==0.4.16
"$ROOT/theseus/bin/python" -m pip install -q --no-build-isolation theseus-ai==0.2.3
