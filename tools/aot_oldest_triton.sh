#!/usr/bin/env bash
# The ahead-of-time compile and spill report (kernels/triton_aot.py) with the oldest Triton
# bertscope supports, 3.6.0 (the GPU image's), beside the pinned one that `make test` checks:
# the shipped block sizes must spill on neither. No GPU needed.
#
#   tools/aot_oldest_triton.sh                        # sm_80 and sm_90, every shipped kernel
#   tools/aot_oldest_triton.sh --arch 90 --json       # any triton_aot option
#   TRITON_VERSION=3.5.0 tools/aot_oldest_triton.sh   # another version
#
# Triton alone (+ numpy) goes into a venv of its own, made once from PyPI ($VENV, default
# tools/.venv-triton<version>); the report runs in the project's python ($PYTHON, default
# .venv/bin/python: its torch and bertscope) with only that triton put first on the path.
# About 5 minutes on 2 cores the first time, seconds once Triton's cache holds the kernels.
# Not in CI (it downloads Triton); run it when a kernel, a block size or the pinned Triton changes.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TRITON_VERSION=${TRITON_VERSION:-3.6.0}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
VENV=${VENV:-$ROOT/tools/.venv-triton$TRITON_VERSION}
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"  # the same python version: triton's extension is built for it
    "$VENV/bin/pip" install --quiet "triton==$TRITON_VERSION" numpy
fi
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
OVERLAY=$(mktemp -d)
trap 'rm -rf "$OVERLAY"' EXIT
ln -s "$SITE/triton" "$OVERLAY/triton"  # that triton only: numpy, torch and the rest stay the project's
env -u TRITON_INTERPRET PYTHONPATH="$OVERLAY${PYTHONPATH:+:$PYTHONPATH}" \
    "$PYTHON" -c 'import sys, triton; from bertscope.kernels.triton_aot import main
assert triton.__version__ == sys.argv[1], f"got triton {triton.__version__}"
sys.exit(main(sys.argv[2:]))' "$TRITON_VERSION" "$@"
