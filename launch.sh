#!/usr/bin/env bash
# Start, stop and inspect the mlx-cluster-serve engine and API gateway (see README.md).
#
# Every process we start runs in its own process group (setsid) whose id is recorded in a pid
# file, so stop can signal the whole group: mlx.launch, its forwarding threads and all local ranks.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
PY="$VENV/bin/python"
API_STOP_GRACE=7     # seconds beyond API_DRAIN_TIMEOUT before the API gets SIGKILL (it flushes for 5 s)
ENGINE_STOP_GRACE=5  # seconds beyond DRAIN_TIMEOUT before the engine gets SIGKILL
API_START_TIMEOUT=30 # seconds for a fresh API to answer /health
PROBE_TIMEOUT=2      # seconds per readiness probe of engine rank 0
# jaccl: seconds between an engine stop and the next start. The RDMA driver releases the old ranks'
# queue pairs and registered memory only after they exit; new ranks must not open the devices sooner.
JACCL_COOLDOWN=10

usage() {
    cat <<'EOF'
usage: ./launch.sh COMMAND

  start             start the engine (all ranks), wait until rank 0 answers, then the API
  stop              stop the API, then the engine (every rank); idempotent
  status            show what runs; exit 0 all up, 1 partly up or dead, 3 all stopped
  restart           stop + start
  restart-api       restart only the API; the engine keeps its weights
  restart-engine    restart only the engine; the API stays up and answers 503 meanwhile
  logs [api|engine] follow the logs (default: both)
  check             preflight every host (Python, mlx, mlx-lm, project, model, jaccl rdma); exit 1 on a fault
  sync              copy the project and .env to the other hosts (rsync over ssh), then set them up
  test [ARGS...]    run the test suite (python -m pytest ARGS...)
  setup             create .venv and install the project (every command does this when needed)

Settings come from the environment and .env; .env.example lists them all.
EOF
}

log() { printf '%s\n' "$*" >&2; }
die() {
    local code=$1
    shift
    log "launch.sh: $*"
    exit "$code"
}

# ---------------------------------------------------------------------------------------------
# setup: .venv with the project installed (editable), marked by a hash of pyproject.toml
# ---------------------------------------------------------------------------------------------

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

# ---------------------------------------------------------------------------------------------
# settings: resolved by Python (config/), never parsed here
# ---------------------------------------------------------------------------------------------

FORWARD_ENV=()

load_settings() {
    local out key value
    out=$("$PY" -m config) ||
        die 2 "fix the setting above (in .env or the environment; .env.example describes every variable)"
    # Remote ranks do not inherit our environment: forward the variables set in it (as the user
    # wrote them, before resolution) so every rank resolves the same settings as rank 0.
    FORWARD_ENV=()
    for key in $(printf '%s\n' "$out" | sed -n 's/^\([A-Z][A-Z0-9_]*\)=.*/\1/p'); do
        [[ $key == API_KEY || $key == RANKS ]] && continue
        if value=$(printenv "$key"); then
            FORWARD_ENV+=(--env "$key=$value")
        fi
    done
    eval "$out"
    ENGINE_PID_FILE="$RUN_DIR/engine.pid"
    ENGINE_STATE_FILE="$RUN_DIR/engine.state.json"
    API_PID_FILE="$RUN_DIR/api.pid"
    ENGINE_STOP_TIMEOUT=$(($(ceil_seconds "$DRAIN_TIMEOUT") + ENGINE_STOP_GRACE))
    API_STOP_TIMEOUT=$(($(ceil_seconds "$API_DRAIN_TIMEOUT") + API_STOP_GRACE))
    ENGINE_LOG="$LOG_DIR/engine.log"
    API_LOG="$LOG_DIR/api.log"
    # what the API prints outside its log (start-up errors, tracebacks); api.log is rotated by the API
    API_CONSOLE_LOG="$LOG_DIR/api.console.log"
    API_URL="http://$(client_host "$API_HOST"):$API_PORT"
}

# The address a local client uses to reach API_HOST.
client_host() {
    case $1 in
        0.0.0.0 | "") printf '127.0.0.1' ;;
        :: | "[::]") printf '[::1]' ;;
        \[*) printf '%s' "$1" ;;
        *:*) printf '[%s]' "$1" ;;
        *) printf '%s' "$1" ;;
    esac
}

# Whole seconds (rounded up) from a settings float such as 600.0; absurd values become a day.
ceil_seconds() {
    local whole=${1%%.*} frac=""
    [[ $1 == *.* ]] && frac=${1#*.}
    [[ $whole =~ ^[0-9]+$ ]] || {
        printf '86400'
        return
    }
    [[ $frac =~ [1-9] ]] && whole=$((whole + 1))
    printf '%s' $((whole > 0 ? whole : 1))
}

now_ms() {
    if [[ -n ${EPOCHREALTIME:-} ]]; then
        local t=${EPOCHREALTIME/[.,]/}
        printf '%s' $((10#${t:0:${#t}-3}))
    else
        printf '%s' $(($(date +%s) * 1000))
    fi
}

# ---------------------------------------------------------------------------------------------
# pid files and process groups (like gunicorn's pidfile: atomic write, kill -0, unlink our own)
# ---------------------------------------------------------------------------------------------

recorded_pid() {
    local pid
    [[ -f $1 ]] || return 1
    pid=$(<"$1") || return 1
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    printf '%s' "$pid"
}

# True while any process of the group is alive (orphaned ranks included). kill -0 alone also
# counts zombies, which linger until their parent (init, for our detached groups) reaps them.
group_alive() {
    kill -0 -- "-$1" 2>/dev/null || return 1
    command -v ps >/dev/null 2>&1 || return 0
    ps -A -o pgid= -o stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { up = 1 } END { exit !up }'
}

# True while process PID itself runs (not a zombie). The engine's supervisor leads its group: the
# group outlives a killed supervisor as long as a rank does.
process_alive() {
    local stat
    kill -0 "$1" 2>/dev/null || return 1
    command -v ps >/dev/null 2>&1 || return 0
    stat=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
    [[ -n $stat && $stat != Z* ]]
}

running_pid() {
    local pid
    pid=$(recorded_pid "$1") || return 1
    group_alive "$pid" || return 1
    printf '%s' "$pid"
}

write_pid() {
    local tmp="$1.tmp.$$"
    printf '%s\n' "$2" >"$tmp"
    mv -f "$tmp" "$1"
}

remove_own_pid_file() {
    local pid
    if pid=$(recorded_pid "$1") && [[ $pid == "$2" ]]; then
        rm -f "$1"
    fi
}

wait_group_gone() {
    local pid=$1 tenths=$(($2 * 10))
    while ((tenths > 0)); do
        group_alive "$pid" || return 0
        sleep 0.1
        tenths=$((tenths - 1))
    done
    ! group_alive "$pid"
}

# stop_group NAME PID_FILE [quiet] [TIMEOUT]: TERM the recorded group, wait, then KILL it; drop the pid file.
stop_group() {
    local name=$1 file=$2 quiet=${3:-} timeout=${4:-$API_STOP_TIMEOUT} pid
    pid=$(recorded_pid "$file") || {
        rm -f "$file"
        return 0
    }
    if group_alive "$pid"; then
        log "stopping $name (process group $pid)"
        kill -TERM -- "-$pid" 2>/dev/null || true
        if ! wait_group_gone "$pid" "$timeout"; then
            log "$name still running after ${timeout}s: sending SIGKILL to process group $pid"
            kill -KILL -- "-$pid" 2>/dev/null || true
            wait_group_gone "$pid" 5 || log "warning: process group $pid survived SIGKILL"
        fi
    elif [[ -z $quiet ]]; then
        log "$name was not running (removing stale pid file $file)"
    fi
    remove_own_pid_file "$file" "$pid"
}

# detach LOG INPUT CMD...: run CMD in a new session with INPUT (opened read-write) as fd 0 and
# LOG appended as stdout and stderr; DETACHED_PID is its pid, which is also its process group id.
detach() {
    local logfile=$1 input=$2
    shift 2
    if command -v setsid >/dev/null 2>&1; then
        # shellcheck disable=SC2016  # expanded by the inner bash
        setsid bash -c 'exec 0<>"$0"; exec "$@"' "$input" "$@" >>"$logfile" 2>&1 &
    else
        # macOS has no setsid(1): the same through Python's os.setsid.
        "$PY" -c 'import os, sys
os.setsid()
os.dup2(os.open(sys.argv[1], os.O_RDWR), 0)
os.execvp(sys.argv[2], sys.argv[2:])' "$input" "$@" >>"$logfile" 2>&1 &
    fi
    DETACHED_PID=$!
    # The child calls setsid a moment after the fork: until then its process group does not
    # exist, and a quick group_alive would report a healthy start as dead.
    local tries=50
    while ((tries-- > 0)) && ! kill -0 -- "-$DETACHED_PID" 2>/dev/null; do
        kill -0 "$DETACHED_PID" 2>/dev/null || break
        sleep 0.02
    done
}

# writable_dir VARIABLE SETTING DIR [MODE]: create DIR when missing; when we cannot write there, die
# with one sentence naming the variable, its value (SETTING) and what to do.
writable_dir() {
    local name=$1 setting=$2 dir=$3 mode=${4:-} err where
    where="the folder $dir"
    [[ $setting == "$dir" ]] && where="that folder"
    if [[ ! -d $dir ]]; then
        if ! err=$(mkdir -p "$(dirname "$dir")" 2>&1 && mkdir ${mode:+-m "$mode"} "$dir" 2>&1) && [[ ! -d $dir ]]; then
            local up=$dir
            while [[ ! -e $up && $up != / && $up != . ]]; do up=$(dirname "$up"); done
            if [[ -e $up && ! -d $up ]]; then
                err="$up is a file, not a folder"
            elif [[ -d $up && ! -w $up ]]; then
                err="$up is not writable"
            else
                err=${err##*: }
            fi
            die 1 "$name=$setting: $where cannot be created ($err); set $name to a path you can write to, or create $dir and give yourself write access"
        fi
    fi
    if [[ ! -w $dir || ! -x $dir ]]; then
        die 1 "$name=$setting: $where is not writable by $(id -un 2>/dev/null || echo you); set $name to a path you can write to, or fix its permissions"
    fi
}

prepare_dirs() {
    # RUN_DIR holds the engine socket: private when we create it (an existing dir is left as is).
    writable_dir RUN_DIR "$RUN_DIR" "$RUN_DIR" 700
    writable_dir LOG_DIR "$LOG_DIR" "$LOG_DIR"
    writable_dir SOCKET_PATH "$SOCKET_PATH" "$(dirname "$SOCKET_PATH")" 700
}

# A lock for the commands that change state, so two of them never interleave.
HELD_LOCK=""

release_lock() {
    if [[ -n $HELD_LOCK ]]; then
        rm -rf "$HELD_LOCK"
        HELD_LOCK=""
    fi
}

acquire_lock() {
    local dir="$RUN_DIR/launch.lock" owner
    prepare_dirs
    if ! mkdir "$dir" 2>/dev/null; then
        owner=$(recorded_pid "$dir/pid" 2>/dev/null || true)
        if [[ -n $owner ]] && kill -0 "$owner" 2>/dev/null; then
            die 1 "another ./launch.sh (pid $owner) is changing the services; try again when it is done"
        fi
        rm -rf "$dir"
        mkdir "$dir" || die 1 "cannot create the lock $dir"
    fi
    HELD_LOCK=$dir
    printf '%s\n' "$$" >"$dir/pid"
    trap release_lock EXIT
}

# ---------------------------------------------------------------------------------------------
# engine
# ---------------------------------------------------------------------------------------------

# mlx.launch unless a single local rank can run directly.
engine_needs_launcher() {
    [[ -n $HOSTFILE || $RANKS -gt 1 ]] && return 0
    case $HOSTS in
        127.0.0.1 | localhost | ::1) return 1 ;;
        *) return 0 ;;
    esac
}

ENGINE_INFO=""

engine_answers() {
    local info
    [[ -S $SOCKET_PATH ]] || return 1
    info=$("$PY" -m ipc.probe --socket "$SOCKET_PATH" --timeout "$PROBE_TIMEOUT" 2>/dev/null) || return 1
    ENGINE_INFO=$info
}

start_engine() {
    local -a cmd
    prepare_dirs
    jaccl_cooldown
    printf '\n=== %s launch.sh: starting engine: model %s, hosts %s, backend %s ===\n' \
        "$(date '+%Y-%m-%d %H:%M:%S')" "$MODEL" "${HOSTFILE:-$HOSTS}" "$BACKEND" >>"$ENGINE_LOG"
    export PYTHONUNBUFFERED=1
    if engine_needs_launcher; then
        cmd=("$VENV/bin/mlx.launch" --backend "$BACKEND" --starting-port "$RING_PORT" --cwd "$ROOT")
        if [[ -n $HOSTFILE ]]; then
            cmd+=(--hostfile "$HOSTFILE")
        else
            cmd+=(--hosts "$HOSTS")
        fi
        cmd+=(${FORWARD_ENV[@]+"${FORWARD_ENV[@]}"} -- "$PY" -m engine)
    else
        cmd=("$PY" -m engine)
    fi
    # The supervisor leads the engine's process group: it ends every rank when one dies or
    # freezes, records which in $ENGINE_STATE_FILE, restarts the engine when ENGINE_RESTART=always,
    # and gives mlx.launch the open, silent stdin that keeps it from spinning a core.
    detach "$ENGINE_LOG" /dev/null "$PY" -m engine.supervise -- "${cmd[@]}"
    ENGINE_PID=$DETACHED_PID
    write_pid "$ENGINE_PID_FILE" "$ENGINE_PID"
}

wait_engine_ready() {
    local pid=$1 limit started next
    limit=$(ceil_seconds "$ENGINE_START_TIMEOUT")
    started=$SECONDS
    next=$((SECONDS + 15))
    log "waiting for engine rank 0 on $SOCKET_PATH (up to ${limit}s; loading $MODEL)"
    while :; do
        if engine_answers; then
            log "engine ready after $((SECONDS - started))s"
            return 0
        fi
        if ! group_alive "$pid"; then
            log "the engine exited during start-up"
            return 1
        fi
        if ((SECONDS - started >= limit)); then
            log "engine rank 0 did not answer within ${limit}s (ENGINE_START_TIMEOUT)"
            return 1
        fi
        if ((SECONDS >= next)); then
            log "  still loading ($((SECONDS - started))s; ./launch.sh logs engine shows progress)"
            next=$((SECONDS + 15))
        fi
        sleep 0.5
    done
}

log_size() { if [[ -f $1 ]]; then wc -c <"$1" | tr -d ' '; else printf '0'; fi; }

# show_log_tail LOG OFFSET: the last 40 lines written to LOG after byte OFFSET (this start's).
show_log_tail() {
    log "---- last 40 lines of $1 ----"
    tail -c "+$(($2 + 1))" "$1" 2>/dev/null | tail -n 40 >&2 || true
    log "----"
}

stop_engine() {
    local was_running=""
    running_pid "$ENGINE_PID_FILE" >/dev/null && was_running=1
    stop_group engine "$ENGINE_PID_FILE" "${1:-}" "$ENGINE_STOP_TIMEOUT"
    [[ -z $was_running ]] || note_engine_stopped
    # Killed engines cannot unlink their socket; it was ours, since start refuses a foreign one.
    if [[ -S $SOCKET_PATH ]]; then
        if engine_answers; then
            log "note: an engine not started by this launch.sh answers on $SOCKET_PATH; left running"
        else
            rm -f "$SOCKET_PATH"
        fi
    fi
}

# The engine's group runs but its supervisor (the group's leader) is gone: nothing restarts the
# engine or ends it when a rank fails. Only restart-engine (or stop) puts that right.
refuse_unsupervised_engine() {
    local pid
    if pid=$(running_pid "$ENGINE_PID_FILE") && ! process_alive "$pid"; then
        die 1 "the engine runs without its supervisor (pid $pid is gone): run ./launch.sh restart-engine to restart it under supervision"
    fi
}

refuse_running_engine() {
    local pid
    if pid=$(running_pid "$ENGINE_PID_FILE"); then
        die 1 "the engine is already running (process group $pid); use ./launch.sh status, stop or restart"
    fi
    if [[ -f $ENGINE_PID_FILE ]]; then
        log "removing stale pid file $ENGINE_PID_FILE"
        rm -f "$ENGINE_PID_FILE"
    fi
    if engine_answers; then
        die 1 "another engine is already serving on $SOCKET_PATH (not started by this launch.sh); stop it or set SOCKET_PATH"
    fi
}

# Start the engine and wait for rank 0; on failure show the log, stop it and return 1.
launch_engine() {
    local offset
    offset=$(log_size "$ENGINE_LOG")
    start_engine
    STARTED_ENGINE=$ENGINE_PID
    if ! wait_engine_ready "$ENGINE_PID"; then
        show_log_tail "$ENGINE_LOG" "$offset"
        stop_engine quiet
        STARTED_ENGINE=""
        return 1
    fi
}

# ---------------------------------------------------------------------------------------------
# API
# ---------------------------------------------------------------------------------------------

http_status() {
    local code
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$API_URL/health" 2>/dev/null) || true
    printf '%s' "${code:-000}"
}

# True unless connecting to the API's address is refused (curl exit 7): a silent listener counts.
api_port_taken() {
    local rc=0
    curl -s -o /dev/null --max-time 1 "$API_URL/health" 2>/dev/null || rc=$?
    [[ $rc -ne 7 ]]
}

# start_api [ARGS...]: ARGS go to python -m api.
start_api() {
    prepare_dirs
    printf '\n=== %s launch.sh: starting API on %s:%s ===\n' \
        "$(date '+%Y-%m-%d %H:%M:%S')" "$API_HOST" "$API_PORT" >>"$API_CONSOLE_LOG"
    export PYTHONUNBUFFERED=1
    detach "$API_CONSOLE_LOG" /dev/null "$PY" -m api --log-file "$API_LOG" "$@"
    API_PID=$DETACHED_PID
    write_pid "$API_PID_FILE" "$API_PID"
}

# wait_api_ready PID WANT: poll /health every 0.1 s until it answers WANT (200, or "any").
wait_api_ready() {
    local pid=$1 want=$2 tenths=$((API_START_TIMEOUT * 10)) code
    while ((tenths > 0)); do
        code=$(http_status)
        if [[ $code == 200 || ($want == any && $code != 000) ]]; then
            group_alive "$pid" && return 0
        fi
        if ! group_alive "$pid"; then
            log "the API exited during start-up"
            return 1
        fi
        sleep 0.1
        tenths=$((tenths - 1))
    done
    log "the API did not answer $API_URL/health within ${API_START_TIMEOUT}s (last status $code)"
    return 1
}

refuse_running_api() {
    local pid
    if pid=$(running_pid "$API_PID_FILE"); then
        die 1 "the API is already running (process group $pid); use ./launch.sh status, stop or restart-api"
    fi
    if [[ -f $API_PID_FILE ]]; then
        log "removing stale pid file $API_PID_FILE"
        rm -f "$API_PID_FILE"
    fi
    if api_port_taken; then
        die 1 "something already listens on $API_URL (not an API started by this launch.sh); stop it or set API_HOST/API_PORT"
    fi
}

# Start the API and wait for /health; on failure show the log, stop it and return 1.
launch_api() {
    local want=$1 t0 offset console_offset
    t0=$(now_ms)
    offset=$(log_size "$API_LOG")
    console_offset=$(log_size "$API_CONSOLE_LOG")
    start_api
    STARTED_API=$API_PID
    if ! wait_api_ready "$API_PID" "$want"; then
        show_log_tail "$API_CONSOLE_LOG" "$console_offset"
        show_log_tail "$API_LOG" "$offset"
        stop_group api "$API_PID_FILE" quiet
        STARTED_API=""
        return 1
    fi
    log "API ready in $(format_ms $(($(now_ms) - t0))) on $API_URL"
}

format_ms() { printf '%d.%03ds' $(($1 / 1000)) $(($1 % 1000)); }

# An API that restart-api replaced finishes its open requests (up to API_DRAIN_TIMEOUT) on its own;
# its process group is recorded in RUN_DIR/api.draining.<pid> so stop and status still see it.
draining_files() {
    local f
    for f in "$RUN_DIR"/api.draining.*; do
        [[ -e $f ]] && printf '%s\n' "$f"
    done
    return 0
}

stop_draining_apis() {
    local f
    while IFS= read -r f; do
        stop_group "previous API" "$f" quiet
    done < <(draining_files)
}

# hand_over_api OLD: start the new API beside the running one (process group OLD) on the same port
# (SO_REUSEPORT); once it listens, OLD stops accepting and drains. Returns 1, with OLD still serving,
# when the new one cannot start that way (e.g. OLD was started without SO_REUSEPORT).
hand_over_api() {
    local old=$1 ready="$RUN_DIR/api.ready.$$" draining="$RUN_DIR/api.draining.$1" t0 tenths offset console_offset
    t0=$(now_ms)
    offset=$(log_size "$API_LOG")
    console_offset=$(log_size "$API_CONSOLE_LOG")
    rm -f "$ready"
    mv -f "$API_PID_FILE" "$draining"
    start_api --take-over --ready-file "$ready"
    STARTED_API=$API_PID
    tenths=$((API_START_TIMEOUT * 10))
    while ((tenths-- > 0)) && [[ $(recorded_pid "$ready" 2>/dev/null || true) != "$API_PID" ]]; do
        group_alive "$API_PID" || break
        sleep 0.1
    done
    if [[ $(recorded_pid "$ready" 2>/dev/null || true) != "$API_PID" ]]; then
        show_log_tail "$API_CONSOLE_LOG" "$console_offset"
        show_log_tail "$API_LOG" "$offset"
        stop_group api "$API_PID_FILE" quiet
        STARTED_API=""
        rm -f "$ready"
        mv -f "$draining" "$API_PID_FILE"
        return 1
    fi
    rm -f "$ready"
    kill -TERM -- "-$old" 2>/dev/null || true
    log "API ready in $(format_ms $(($(now_ms) - t0))) on $API_URL (pid $API_PID); the previous API (process group $old) stopped accepting and finishes its open requests within API_DRAIN_TIMEOUT=${API_DRAIN_TIMEOUT}s"
}

# ---------------------------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------------------------

STARTED_ENGINE=""
STARTED_API=""

# Ctrl-C during start: stop what this invocation started, nothing else.
abort_start() {
    trap - INT TERM
    log "interrupted: stopping what this start began"
    if [[ -n $STARTED_API ]]; then stop_group api "$API_PID_FILE"; fi
    if [[ -n $STARTED_ENGINE ]]; then stop_engine; fi
    exit 130
}

info_summary() {
    "$PY" - "$ENGINE_INFO" <<'PY'
import json, sys
i = json.loads(sys.argv[1])
print(f"{i['ranks']} rank(s), backend {i['backend']}, context {i['context_length']} tokens")
PY
}

print_summary() {
    local name=$SERVED_MODEL_NAME auth=""
    [[ -n $API_KEY ]] && auth=" -H 'Authorization: Bearer <API_KEY>'"
    cat <<EOF
mlx-cluster-serve is up
  API      $API_URL/v1   (pid $API_PID, log $API_LOG)
  engine   model $name, $(info_summary)   (pid $ENGINE_PID, log $ENGINE_LOG)
  socket   $SOCKET_PATH

try it:
  curl $API_URL/v1/chat/completions -H 'Content-Type: application/json'$auth \\
       -d '{"model":"$name","messages":[{"role":"user","content":"hello"}],"max_tokens":32}'

./launch.sh status | logs | restart-api | stop
EOF
}

cmd_start() {
    local api_pid engine_pid
    acquire_lock
    refuse_unsupervised_engine
    if engine_pid=$(running_pid "$ENGINE_PID_FILE") && api_pid=$(running_pid "$API_PID_FILE"); then
        die 1 "already running (engine process group $engine_pid, API process group $api_pid); use ./launch.sh status, stop or restart"
    fi
    if api_pid=$(running_pid "$API_PID_FILE"); then
        # Only the engine is missing (it failed, or was stopped): start it under the running API.
        log "the API is already running (process group $api_pid); starting the engine"
        refuse_running_engine
        trap abort_start INT TERM
        launch_engine || exit 1
        trap - INT TERM
        API_PID=$api_pid
        wait_api_ready "$api_pid" 200 || exit 1
        print_summary
        return 0
    fi
    if engine_pid=$(running_pid "$ENGINE_PID_FILE"); then
        # Only the API is missing: start it in front of the running engine.
        log "the engine is already running (process group $engine_pid); starting the API"
        refuse_running_api
        engine_answers || die 1 "the engine (process group $engine_pid) is not answering on $SOCKET_PATH yet; see ./launch.sh status, then ./launch.sh restart-api"
        ENGINE_PID=$engine_pid
        launch_api 200 || exit 1
        print_summary
        return 0
    fi
    refuse_running_api
    refuse_running_engine
    trap abort_start INT TERM
    launch_engine || exit 1
    if ! launch_api 200; then
        log "the engine keeps running (process group $ENGINE_PID): fix the API and run ./launch.sh restart-api, or ./launch.sh stop"
        exit 1
    fi
    trap - INT TERM
    print_summary
}

cmd_stop() {
    local interrupted=""
    acquire_lock
    # A stop runs to its end: interrupted halfway it would leave the API up without its engine.
    trap 'interrupted=1' INT TERM
    # The engine first: it lets in-flight requests finish for DRAIN_TIMEOUT and ends the rest with
    # an error the API still relays; then the API has nothing left to cut.
    stop_engine
    stop_group api "$API_PID_FILE"
    stop_draining_apis
    trap - INT TERM
    [[ -z $interrupted ]] || log "(the stop was interrupted by a signal; it completed anyway)"
}

cmd_restart_api() {
    local want=200 old
    acquire_lock
    stop_draining_apis_gone
    if ! running_pid "$ENGINE_PID_FILE" >/dev/null || ! engine_answers; then
        log "warning: the engine is not answering; the API will answer 503 until it is up"
        want=any
    fi
    # Zero downtime: the new API serves on the same port before the old one stops accepting, and
    # the old one's open streams run to their end (within API_DRAIN_TIMEOUT) instead of being cut.
    if old=$(running_pid "$API_PID_FILE"); then
        hand_over_api "$old" && return 0
        log "could not start the new API beside the running one; restarting it the plain way (its open requests get API_DRAIN_TIMEOUT=${API_DRAIN_TIMEOUT}s)"
    fi
    stop_group api "$API_PID_FILE"
    refuse_running_api
    launch_api "$want" || exit 1
}

# Forget replaced APIs that have finished draining.
stop_draining_apis_gone() {
    local f pid
    while IFS= read -r f; do
        pid=$(recorded_pid "$f") && group_alive "$pid" && continue
        rm -f "$f"
    done < <(draining_files)
}

cmd_restart_engine() {
    acquire_lock
    stop_engine
    refuse_running_engine
    launch_engine || exit 1
    release_lock
    if ! running_pid "$API_PID_FILE" >/dev/null; then
        log "note: the API is not running; start it with ./launch.sh restart-api"
    fi
}

# Prints a readable view of rank 0's Info JSON.
describe_info() {
    "$PY" - "$1" <<'PY'
import json, sys
i = json.loads(sys.argv[1])

def dur(s):
    s = int(s)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"

print(f"  model     {i['model']}  ({i['model_path']}, context {i['context_length']} tokens)")
print(f"  ranks     {i['ranks']}, backend {i['backend']}, engine pid {i['engine_pid']}, up {dur(i.get('uptime', 0))}")
print(f"  step      {i.get('step', 0)}  (last step {i.get('last_step_age', 0):.1f}s ago)")
print(f"  requests  {i.get('active', 0)} active of {i.get('max_batch', 0)} slots, {i.get('queued', 0)} queued of {i.get('max_queue', 0)}")
def size(n):
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"

for r in i.get("rank_states") or []:
    used = r.get("host_memory_total", 0) - r.get("host_memory_available", 0)
    print(f"  rank {r['rank']:<4} {r.get('host') or '?'}  pid {r.get('pid', 0)}  step {r.get('step', 0)}"
          f"  reported {r.get('report_age', 0):.1f}s ago  memory {size(r.get('active_memory', 0))}"
          f" (cache {size(r.get('cache_memory', 0))}, peak {size(r.get('peak_memory', 0))})"
          f"  host {size(used)} of {size(r.get('host_memory_total', 0))} used")
PY
}

# describe_failures PID: what the engine's supervisor (process group PID) recorded about failed ranks
# and restarts in $ENGINE_STATE_FILE; prints nothing when it recorded none.
describe_failures() {
    [[ -f $ENGINE_STATE_FILE ]] || return 0
    "$PY" - "$ENGINE_STATE_FILE" "$1" <<'PY' 2>/dev/null || true
import json, sys, time
try:
    s = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit()
if str(s.get("pid")) != sys.argv[2]:
    sys.exit()  # left by another start
f = s.get("last_failure")
when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f["time"])) if f else ""
if s.get("state") == "restarting" and f:
    wait = max(0, (s.get("next_restart_at") or 0) - time.time())
    print(f"  RESTARTING in {wait:.0f}s (ENGINE_RESTART=always): at {when} {f['summary']}")
elif s.get("state") == "starting" and s.get("restarts") and f:
    print(f"  RESTARTING now (restart {s['restarts']}, ENGINE_RESTART=always): at {when} {f['summary']}")
elif f:
    print(f"  last failure  at {when}: {f['summary']}")
if f and f.get("detail"):
    print(f"                its last words: {f['detail']}")
if s.get("restarts"):
    print(f"  restarts      {s['restarts']} since start (ENGINE_RESTART={s.get('restart')})")
PY
}

# supervisor_state PID: the state the engine's supervisor (PID) last recorded, if the state file is its.
supervisor_state() {
    [[ -f $ENGINE_STATE_FILE ]] || return 0
    "$PY" - "$ENGINE_STATE_FILE" "$1" <<'PY' 2>/dev/null || true
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit()
if str(s.get("pid")) == sys.argv[2]:
    print(s.get("state", ""))
PY
}

cmd_status() {
    local engine_pid="" api_pid code engine_state api_state failures file pid
    # engine
    if engine_pid=$(running_pid "$ENGINE_PID_FILE") && ! process_alive "$engine_pid"; then
        engine_state=unsupervised
        printf 'engine   UNSUPERVISED: its supervisor (pid %s) is gone, yet processes of its group still run\n' "$engine_pid"
        printf '         nothing restarts the engine or ends it when a rank fails (ENGINE_RESTART no longer applies),\n'
        printf '         and its output reaches no log: run ./launch.sh restart-engine\n'
    elif [[ -n $engine_pid ]]; then
        if engine_answers; then
            engine_state=up
            printf 'engine   running, rank 0 answering   process group %s   socket %s\n' "$engine_pid" "$SOCKET_PATH"
            describe_info "$ENGINE_INFO"
            describe_failures "$engine_pid"
        else
            engine_state=degraded
            printf 'engine   running but rank 0 NOT answering (still loading, restarting, or hung)   process group %s\n' "$engine_pid"
            printf '         model %s, hosts %s; see %s\n' "$MODEL" "${HOSTFILE:-$HOSTS}" "$ENGINE_LOG"
            describe_failures "$engine_pid"
        fi
    elif engine_pid=$(recorded_pid "$ENGINE_PID_FILE"); then
        engine_state=dead
        failures=$(describe_failures "$engine_pid")
        if [[ $(supervisor_state "$engine_pid") =~ ^(starting|running|restarting|stopping)$ ]]; then
            # The supervisor never recorded an end: it was killed, and the engine ended with it.
            printf 'engine   DEAD: its supervisor (pid %s) was killed or crashed without recording why, and the engine\n' "$engine_pid"
            printf '         stopped with it (nothing restarts it, whatever ENGINE_RESTART says): run ./launch.sh start\n'
            [[ -z $failures ]] || printf '%s\n' "$failures"
        elif [[ -n $failures ]]; then
            printf 'engine   DEAD: a rank failed and the engine ended (process group %s is gone)\n%s\n' "$engine_pid" "$failures"
        else
            printf 'engine   DEAD: process group %s is gone but its pid file remains (crashed, or ended by the watchdog)\n' "$engine_pid"
        fi
        printf '         last lines of %s:\n' "$ENGINE_LOG"
        tail -n 5 "$ENGINE_LOG" 2>/dev/null | sed 's/^/         | /' || true
    elif engine_answers; then
        engine_state=foreign
        printf 'engine   an engine not started by this launch.sh answers on %s\n' "$SOCKET_PATH"
        describe_info "$ENGINE_INFO"
    else
        engine_state=stopped
        printf 'engine   stopped\n'
    fi
    # API
    if api_pid=$(running_pid "$API_PID_FILE"); then
        code=$(http_status)
        if [[ $code == 200 ]]; then
            api_state=up
            printf 'api      running   pid %s   %s   (/health 200)\n' "$api_pid" "$API_URL"
        else
            api_state=degraded
            printf 'api      running but /health answers %s   pid %s   %s\n' "$code" "$api_pid" "$API_URL"
        fi
    elif api_pid=$(recorded_pid "$API_PID_FILE"); then
        api_state=dead
        printf 'api      DEAD: pid %s is gone but its pid file remains; see %s\n' "$api_pid" "$API_LOG"
    else
        api_state=stopped
        printf 'api      stopped\n'
    fi
    while IFS= read -r file; do
        if pid=$(running_pid "$file"); then
            printf 'api      previous API (process group %s), replaced by restart-api, finishing its open requests (API_DRAIN_TIMEOUT=%ss)\n' "$pid" "$API_DRAIN_TIMEOUT"
        fi
    done < <(draining_files)
    printf 'logs     %s   %s\n' "$ENGINE_LOG" "$API_LOG"
    if [[ $engine_state == up && $api_state == up ]]; then
        return 0
    elif [[ $engine_state == stopped && $api_state == stopped ]]; then
        return 3
    fi
    return 1
}

cmd_logs() {
    local -a files
    case ${1:-both} in
        api) files=("$API_LOG" "$API_CONSOLE_LOG") ;;
        engine) files=("$ENGINE_LOG") ;;
        both) files=("$ENGINE_LOG" "$API_LOG" "$API_CONSOLE_LOG") ;;
        *) die 2 "logs takes api, engine or nothing (both), not '$1'" ;;
    esac
    writable_dir LOG_DIR "$LOG_DIR" "$LOG_DIR"
    exec tail -n 100 -F "${files[@]}"
}

# ---------------------------------------------------------------------------------------------
# cluster: preflight, sync, and the jaccl cool-down
# ---------------------------------------------------------------------------------------------

# Every host: same Python, mlx and mlx-lm, the project at this path, the same model; for jaccl,
# a well-formed rdma matrix and PORT_ACTIVE devices. Local hosts are checked without ssh.
cmd_check() {
    "$PY" -m config.cluster check
}

# Copy the project and .env to every non-local host (rsync over ssh), then ./launch.sh setup there.
cmd_sync() {
    "$PY" -m config.cluster sync
}

note_engine_stopped() {
    if [[ $BACKEND == jaccl ]]; then
        date +%s >"$RUN_DIR/engine.stopped-at"
    fi
}

jaccl_cooldown() {
    local file="$RUN_DIR/engine.stopped-at" at wait
    [[ $BACKEND == jaccl && -f $file ]] || return 0
    at=$(<"$file")
    [[ $at =~ ^[0-9]+$ ]] || return 0
    wait=$((at + JACCL_COOLDOWN - $(date +%s)))
    if ((wait > 0)); then
        log "jaccl: waiting ${wait}s for the RDMA devices of the stopped ranks to be released (JACCL_COOLDOWN)"
        sleep "$wait"
    fi
}

main() {
    local command=${1:-}
    [[ $# -gt 0 ]] && shift
    case $command in
        -h | --help | help)
            usage
            return 0
            ;;
        "")
            usage >&2
            return 2
            ;;
        start | stop | status | restart | restart-api | restart-engine | logs | test | setup | check | sync) ;;
        *)
            log "launch.sh: unknown command '$command'"
            usage >&2
            return 2
            ;;
    esac
    setup
    case $command in
        setup) return 0 ;;
        test) exec "$PY" -m pytest ${1+"$@"} ;;
    esac
    load_settings
    case $command in
        start) cmd_start ;;
        stop) cmd_stop ;;
        status) cmd_status ;;
        restart)
            cmd_stop
            release_lock
            cmd_start
            ;;
        restart-api) cmd_restart_api ;;
        restart-engine) cmd_restart_engine ;;
        logs) cmd_logs "$@" ;;
        check) cmd_check ;;
        sync) cmd_sync ;;
    esac
}

main "$@"
