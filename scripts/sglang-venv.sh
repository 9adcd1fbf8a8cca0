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
pins="$here/sglang-pins.txt"
python=${PYTHON:-python3}
rebuild=0
[ "${1:-}" = "--rebuild" ] && rebuild=1

key=$({ cat "$pins"; "$python" -c 'import sys; print(sys.version_info[:2])'; } | sha256sum | cut -c1-12)
root=${REGISTRAR_CACHE:-$HOME/.cache/registrar}
venv="$root/sglang-$key"
mkdir -p "$root"

log() { echo "sglang-venv: $*" >&2; }

exec 8>"$venv.lock"
flock 8
if [ "$rebuild" = 1 ] || [ ! -f "$venv/.complete" ]; then
  started=$(date +%s)
  log "building $venv (first run: a few minutes)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  # torch first and alone: its CPU build must come from a --find-links folder, never PyPI.
  if ! "$venv/bin/python" -m pip install -q --no-deps "$(grep '^torch==' "$pins")" >&2; then
    log "no $(grep '^torch==' "$pins") wheel found: put the CPU build in a folder named by"
    log "PIP_FIND_LINKS (PyPI's torch is the CUDA build and is not used here)"
    exit 1
  fi
  "$venv/bin/python" -m pip install -q --no-deps -r "$pins" 2> >(grep -v '^WARNING: Location' >&2)
  touch "$venv/.complete"
  log "built in $(( $(date +%s) - started )) s, $(du -sh "$venv" | cut -f1)"
fi
# This checkout, editable, so SGLang's plugin loader finds registrar's entry point. Offline:
# the build backend is among the pins.
# The distribution was named `registrar` before 0.2.0 (`sglang-registrar` since): a checkout of
# either name replaces the other, so SGLang's loader finds one registrar entry point, not two.
"$venv/bin/python" -m pip uninstall -q -y registrar sglang-registrar >/dev/null 2>&1 || true
"$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$repo" >&2
flock -u 8
echo "$venv"
