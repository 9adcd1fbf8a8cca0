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
pins="$here/smg-pins.txt"
python=${PYTHON:-python3}
rebuild=0
[ "${1:-}" = "--rebuild" ] && rebuild=1

key=$({ cat "$pins"; "$python" -c 'import sys; print(sys.version_info[:2])'; } | sha256sum | cut -c1-12)
root=${REGISTRAR_CACHE:-$HOME/.cache/registrar}
venv="$root/smg-$key"
mkdir -p "$root"

log() { echo "smg-venv: $*" >&2; }

exec 8>"$venv.lock"
flock 8
if [ "$rebuild" = 1 ] || [ ! -f "$venv/.complete" ]; then
  started=$(date +%s)
  log "building $venv"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --no-deps -r "$pins" 2> >(grep -v '^WARNING: Location' >&2)
  "$venv/bin/smg" --help >/dev/null
  touch "$venv/.complete"
  log "built in $(( $(date +%s) - started )) s, $(du -sh "$venv" | cut -f1)"
fi
flock -u 8
echo "$venv/bin/smg"
