#!/usr/bin/env bash
# Build, once, the CPU virtual environment holding SGLang's real code for tests/sglang_real, and
# print its path. The environment lives outside the repo, keyed by the pins and the Python
# version, so every clone and every CI run on the machine reuses it:
#     ${REGISTRAR_CACHE:-$HOME/.cache/registrar}/sglang-<hash>
# Every package is pinned and installed with --no-deps: nothing is resolved, so no CUDA build of
# torch (several GB) can be pulled in by a range. SGLang 0.5.23's pins are scripts/sglang-pins.txt;
# another release X is that file with the lines of scripts/sglang-pins-X.txt replacing the pins of
# the same packages (SGLang itself, and the light packages its wheel pins otherwise), so each
# release has an environment of its own, keyed by its merged pins. The first build takes a few
# minutes (about 2.5 GB); later runs only re-point the editable install of this checkout (a
# second or two). Safe to run concurrently: builds are serialised by a lock.
#
# Usage: scripts/sglang-venv.sh [--release X] [--rebuild]
#   (prints the venv path on stdout; logs on stderr; X defaults to 0.5.23)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
base_release=0.5.23
release=$base_release rebuild=
while [ $# -gt 0 ]; do
  case $1 in
    --release) release=${2:?--release needs a version, e.g. --release 0.5.19}; shift 2 ;;
    --rebuild) rebuild=--rebuild; shift ;;
    *) echo "sglang-venv: unknown argument $1 (usage: [--release X] [--rebuild])" >&2; exit 2 ;;
  esac
done
# shellcheck source=scripts/cached-venv.sh
. "$here/cached-venv.sh"

build() {
  local venv=$1 pins=$2
  # torch first and alone: its CPU build must come from a --find-links folder, never PyPI.
  if ! "$venv/bin/python" -m pip install -q --no-deps --no-compile "$(grep '^torch==' "$pins")" >&2; then
    echo "sglang-venv: no $(grep '^torch==' "$pins") wheel found: put the CPU build in a folder" >&2
    echo "sglang-venv: named by PIP_FIND_LINKS (PyPI's torch is the CUDA build, not used here)" >&2
    exit 1
  fi
  install_pins "$venv" "$pins"
}

# The pins of the release asked for: the base file itself for 0.5.23, else the base with the
# release's overrides put in place (matched by normalised package name).
pins=$here/sglang-pins.txt
if [ "$release" != "$base_release" ]; then
  overrides=$here/sglang-pins-$release.txt
  if [ ! -f "$overrides" ]; then
    echo "sglang-venv: no pins for SGLang $release: add $overrides (its lines replace" >&2
    echo "sglang-venv: the pins of scripts/sglang-pins.txt; known: $(cd "$here" &&
      ls sglang-pins-*.txt | sed 's/sglang-pins-//; s/\.txt$//' | tr '\n' ' ')$base_release)" >&2
    exit 2
  fi
  pins=$(mktemp)
  trap 'rm -f "$pins"' EXIT
  merge_pins "$here/sglang-pins.txt" "$overrides" >"$pins"
fi

cached_venv sglang "$pins" build "$rebuild"
# What a rank process (tests/sglang_real) and a whole server (tests/e2e) import, with the
# end-to-end suite's stand-ins in place as in its servers' processes.
PYTHONPATH="$repo/tests/e2e/e2e_support/boot" warm_bytecode "$venv" \
  sglang.srt.disaggregation.common.conn sglang.srt.server_args sglang.launch_server \
  sglang.srt.entrypoints.http_server sglang.srt.managers.scheduler \
  sglang.srt.managers.detokenizer_manager sglang.srt.models.llama
# This checkout, editable, so SGLang's plugin loader finds registrar's entry point. Offline:
# the build backend is among the pins.
# The distribution was named `registrar` before 0.2.0 (`sglang-registrar` since): a checkout of
# either name replaces the other, so SGLang's loader finds one registrar entry point, not two.
"$venv/bin/python" -m pip uninstall -q -y registrar sglang-registrar >/dev/null 2>&1 || true
"$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$repo" >&2
flock -u 8
echo "$venv"
