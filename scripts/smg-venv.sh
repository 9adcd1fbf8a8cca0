#!/usr/bin/env bash
# Build, once, the virtual environment holding SGLang's model gateway (`smg`, a Rust binary in a
# wheel) for the gateway tests (tests/test_smg_gateway.py) and benchmark, and print the path of
# its `smg` executable. The environment lives outside the repo, keyed by the pins and the Python
# version, so every clone and every CI run on the machine reuses it:
#     ${REGISTRAR_CACHE:-$HOME/.cache/registrar}/smg-<hash>
# Every package is pinned in scripts/smg-pins.txt and installed with --no-deps. Safe to run
# concurrently: builds are serialised by a lock.
#
# Usage: scripts/smg-venv.sh [--rebuild]    (prints the smg executable's path; logs on stderr)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/cached-venv.sh
. "$here/cached-venv.sh"

build() {
  install_pins "$1" "$2"
  "$1/bin/smg" --help >/dev/null
}

cached_venv smg "$here/smg-pins.txt" build "${1:-}"
flock -u 8
echo "$venv/bin/smg"
