#!/usr/bin/env bash
# Start, stop and inspect the mlx-cluster-serve engine and API gateway (see README.md).
#
# Only what must be bash lives here: find or create .venv (installing the project whenever
# pyproject.toml changes), then hand the command to `python -m ops`, which owns the lifecycle:
# process groups, pid files, readiness, status, the engine supervisor, and the cluster preflight.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
PY="$VENV/bin/python"

usage() { cat "$ROOT/ops/usage.txt"; }

log() { printf '%s\n' "$*" >&2; }
die() {
    local code=$1
    shift
    log "launch.sh: $*"
    exit "$code"
}

# .venv with the project installed (editable), marked by a hash of pyproject.toml.
install_marker() {
    local sum
    sum=$(cksum <pyproject.toml)
    printf '%s/.installed-%s\n' "$VENV" "${sum%% *}"
}

setup() {
    local marker base
    marker=$(install_marker)
    if [[ -x $PY && -f $marker ]]; then
        return 0
    fi
    if [[ ! -x $PY ]]; then
        base=${PYTHON:-python3}
        command -v "$base" >/dev/null 2>&1 ||
            die 1 "$base not found: install Python >= 3.10 or set PYTHON=/path/to/python3"
        "$base" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
            die 1 "$("$base" --version 2>&1) is too old: mlx-cluster-serve needs Python >= 3.10 (set PYTHON=/path/to/python3)"
        log "creating $VENV with $("$base" --version 2>&1)"
        "$base" -m venv "$VENV" || die 1 "could not create $VENV"
    fi
    log "installing mlx-cluster-serve and its dependencies into .venv (the first time takes a few minutes)"
    "$PY" -m pip install --quiet --disable-pip-version-check -e '.[test]' ||
        die 1 "pip install failed (errors above); fix them and run ./launch.sh setup"
    rm -f "$VENV"/.installed-*
    : >"$marker"
    log "installed; .venv is ready"
}

main() {
    local command=${1:-}
    case $command in
        -h | --help | help)
            usage
            return 0
            ;;
        "")
            usage >&2
            return 2
            ;;
        start | stop | status | restart | restart-api | restart-engine | logs | test | setup | check | sync | download | models | switch) ;;
        *)
            log "launch.sh: unknown command '$command'"
            usage >&2
            return 2
            ;;
    esac
    setup
    [[ $command == setup ]] && return 0
    exec "$PY" -m ops "$@"
}

main "$@"
