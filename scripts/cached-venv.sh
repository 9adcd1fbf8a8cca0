# Sourced by the *-venv.sh scripts: one virtual environment per pin file, built once per machine
# outside the repo and reused by every clone and CI run. The environment is keyed by the pins and
# the Python version:  ${REGISTRAR_CACHE:-$HOME/.cache/registrar}/NAME-<hash>
#
#   cached_venv NAME PINS BUILD [--rebuild]
#
# holds a lock on the environment (builds are serialised; concurrent callers wait), calls
# `BUILD VENV PINS` when the environment is missing or incomplete (or asked to rebuild), and
# leaves the lock held (file descriptor 8) and the path in $venv for the caller's last steps.
# Every package is installed with --no-deps: nothing is resolved, nothing unpinned slips in.

cached_venv() {
  local name=$1 pins=$2 build=$3 rebuild=${4:-}
  local python=${PYTHON:-python3} key root started
  key=$({ cat "$pins"; "$python" -c 'import sys; print(sys.version_info[:2])'; } | sha256sum | cut -c1-12)
  root=${REGISTRAR_CACHE:-$HOME/.cache/registrar}
  venv="$root/$name-$key"
  mkdir -p "$root"
  exec 8>"$venv.lock"
  flock 8
  if [ "$rebuild" = "--rebuild" ] || [ ! -f "$venv/.complete" ]; then
    started=$(date +%s)
    echo "$name-venv: building $venv" >&2
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$build" "$venv" "$pins"
    touch "$venv/.complete"
    echo "$name-venv: built in $(( $(date +%s) - started )) s, $(du -sh "$venv" | cut -f1)" >&2
  fi
}

# pip's --no-deps install of a pin file, without its noise about missing --find-links folders.
# --no-compile: byte-compiling every module of torch and SGLang was most of a build's CPU time
# (698 s against 171 s for SGLang's environment on a loaded 2-core machine); only the modules a
# run imports are compiled, once (warm_bytecode below, and .ci/run lets Python keep the rest).
install_pins() {
  "$1/bin/python" -m pip install -q --no-deps --no-compile -r "$2" 2> >(grep -v '^WARNING: Location' >&2)
}

# A pin file with another's pins put in place: the lines of OVERRIDES (comments ignored) replace
# the BASE pins of the same package (names compared as pip does: case, `_` and `.` alike); the
# ones BASE lacks are added at the end. Prints the result.
merge_pins() {
  awk '
    function key(line) { sub(/[=<>!~ ].*/, "", line); line = tolower(line); gsub(/[_.]/, "-", line); return line }
    NR == FNR { if ($0 !~ /^[[:space:]]*(#|$)/) { over[key($0)] = $0; order[++n] = key($0) } next }
    $0 !~ /^[[:space:]]*(#|$)/ && (key($0) in over) { print over[key($0)]; used[key($0)] = 1; next }
    { print }
    END { for (i = 1; i <= n; i++) if (!(order[i] in used)) print over[order[i]] }
  ' "$2" "$1"
}

# Compile and keep the bytecode of MODULES (names, space-separated) and all they import, once
# per environment (a stamp file records it). Where PYTHONDONTWRITEBYTECODE is set, as on the CI
# machine, Python otherwise compiles torch, transformers and SGLang anew in every process that
# imports them: 11 CPU-s for each SGLang rank process instead of 5 with the bytecode kept.
warm_bytecode() {
  local venv=$1
  shift
  [ -f "$venv/.bytecode" ] && return 0
  env -u PYTHONDONTWRITEBYTECODE "$venv/bin/python" -W ignore -c '
import importlib, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:  # a module another release lacks: the others are still warmed
        print(f"warm_bytecode: {name}: {exc!r}", file=sys.stderr)
' "$@" >/dev/null 2> >(grep '^warm_bytecode' >&2)
  touch "$venv/.bytecode"
}
