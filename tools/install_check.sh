#!/usr/bin/env bash
# Install bertscope beside a torch the user already has, as a user with a GPU would, and check
# that it leaves that torch in place and works with it:
#
#   tools/install_check.sh            # torch 2.12.0 (not the Makefile's 2.13.0)
#   tools/install_check.sh 2.6.0      # the oldest torch bertscope supports (transformers 5's floor)
#
# 1. a fresh venv in /tmp; torch==<version> with --no-deps from pip's configured index (PyPI
#    unless pip.conf or PIP_INDEX_URL says otherwise; PyPI's Linux wheels are CUDA builds, and
#    without the nvidia-* packages they run on the CPU, which is all this needs), then torch's
#    own pure-Python dependencies;
# 2. `pip install <this checkout>`: must leave torch as it was (`pip show torch`);
# 3. the embedded defaults with the documented command, `bertscope data install-defaults`;
# 4. `bertscope --version`, `bertscope selftest` (every CPU backend against eager) and a short
#    `bertscope run` on Wikipedia.
# Downloads ~0.5-0.8 GB (torch) plus transformers & co. on first use: several minutes, so it is not
# in CI. Every package comes from pip's configured index; set TORCH_INDEX to take torch alone
# from another one (pip's --index-url).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TORCH_VERSION=${1:-2.12.0}
PYTHON=${PYTHON:-python3}
TORCH_INDEX_ARGS=()  # pip's own index unless TORCH_INDEX names one
if [ -n "${TORCH_INDEX:-}" ]; then TORCH_INDEX_ARGS=(--index-url "$TORCH_INDEX"); fi
VENV=${VENV:-/tmp/bertscope-install-check-$TORCH_VERSION}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

step() { echo; echo "\$ $*"; "$@"; }

echo "# tools/install_check.sh $TORCH_VERSION, $(date -u +%Y-%m-%d), $("$PYTHON" --version), $(uname -m)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
BIN=$VENV/bin
step "$BIN/pip" install --quiet --no-deps ${TORCH_INDEX_ARGS[@]+"${TORCH_INDEX_ARGS[@]}"} "torch==$TORCH_VERSION"
# torch's dependencies but the CUDA libraries (nvidia-*, triton): it runs on the CPU
step "$BIN/pip" install --quiet filelock typing-extensions sympy networkx jinja2 fsspec
before=$("$BIN/pip" show torch | grep '^Version:')
echo "before: torch $before"

step "$BIN/pip" install --quiet "$ROOT"
after=$("$BIN/pip" show torch | grep '^Version:')
echo "after:  torch $after"
if [ "$before" != "$after" ]; then
    echo "FAIL: pip install changed torch ($before -> $after)"; exit 1
fi
echo "OK: torch left in place"

step "$BIN/bertscope" data install-defaults --quiet
cd "$WORK"  # never the checkout: the installed bertscope is the one under test
step "$BIN/bertscope" --version
step "$BIN/python" -c 'import torch, transformers, bertscope; print("imported: bertscope", bertscope.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "from", bertscope.__file__)'
step "$BIN/bertscope" selftest --device cpu
step "$BIN/bertscope" run --corpus wiki --limit 16 --threads 1 --no-figures --quiet --out "$WORK/run"
"$BIN/python" -c 'import csv, sys; rows = list(csv.DictReader(open(sys.argv[1]))); print(f"heads.csv: {len(rows)} heads")' "$WORK/run/heads.csv"
echo
"$BIN/pip" list --format=freeze 2>/dev/null | grep -iE '^(torch|transformers|tokenizers|numpy|scipy|pyarrow|filelock|triton|nvidia)' || true
echo "PASS: bertscope beside torch $TORCH_VERSION"
