#!/usr/bin/env bash
# Build, once, the CPU virtual environment holding SGLang's real code for tests/sglang_real, and
# print its path. The environment lives outside the repo, keyed by the pins and the Python
# version, so every clone and every CI run on the machine reuses it:
#     ${REGISTRAR_CACHE:-$HOME/.cache/registrar}/sglang-<hash>
# Every package is pinned in scripts/sglang-pins.txt and installed with --no-deps: nothing is
# resolved, so no CUDA build of torch (several GB) can be pulled in by a range. The first build
# takes a few minutes (about 2.6 GB); later runs only re-point the editable install of this
# checkout (a second or two). Safe to run concurrently: builds are serialised by a lock.
#
# Usage: scripts/sglang-venv.sh [--rebuild]     (prints the venv path on stdout; logs on stderr)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
# shellcheck source=scripts/cached-venv.sh
. "$here/cached-venv.sh"

build() {
  local venv=$1 pins=$2
  # torch first and alone: its CPU build must come from a --find-links folder, never PyPI.
  if ! "$venv/bin/python" -m pip install -q --no-deps "$(grep '^torch==' "$pins")" >&2; then
    echo "sglang-venv: no $(grep '^torch==' "$pins") wheel found: put the CPU build in a folder" >&2
    echo "sglang-venv: named by PIP_FIND_LINKS (PyPI's torch is the CUDA build, not used here)" >&2
    exit 1
  fi
  install_pins "$venv" "$pins"
}

cached_venv sglang "$here/sglang-pins.txt" build "${1:-}"
# This checkout, editable, so SGLang's plugin loader finds registrar's entry point. Offline:
# the build backend is among the pins.
# The distribution was named `registrar` before 0.2.0 (`sglang-registrar` since): a checkout of
# either name replaces the other, so SGLang's loader finds one registrar entry point, not two.
"$venv/bin/python" -m pip uninstall -q -y registrar sglang-registrar >/dev/null 2>&1 || true
"$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$repo" >&2
flock -u 8
echo "$venv"
