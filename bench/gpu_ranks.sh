#!/usr/bin/env bash
# The two-rank tests of the plan channel and the link probe on a Linux machine with one NVIDIA GPU and MLX's
# CUDA build, where the GPU is the default device: the nearest thing to a Mac (where mlx-lm's generation stream
# is the GPU's) that a Linux box offers. Ranks run on loopback over the ring backend. Not part of CI.
#
#   bash bench/gpu_ranks.sh prepare   # here, with PyPI: the wheels into .whl/ (and .whl-first/, see below)
#   bash bench/gpu_ranks.sh stash     # there, 1st call, carry .whl-first: the first part of mlx-cuda-13 to /tmp
#   bash bench/gpu_ranks.sh           # there, 2nd call at once (a machine stays warm 30 s), carry .whl: the run
#
# mlx-cuda-13 is one 86 MiB wheel (its libmlx.so alone is 75 MiB zipped), more than one call may carry (64 MiB),
# so `prepare` splits it in two; with a whole wheel in .whl/ one call does. The machine's own python3 holds
# numpy, transformers, tokenizers and CUDA 13's libraries (nvidia-*): the venv sees them (a .pth file, a link
# to nvidia/ where libmlx.so looks for them) and gets only what is missing from .whl, with --no-deps.
set -uo pipefail
cd "$(dirname "$0")/.."

STASH=/tmp/gpu-ranks-whl
CUDA_WHEEL=mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl
# exactly what the machine lacks (its image has numpy, transformers, tokenizers, jinja2, protobuf, pyyaml,
# sentencepiece, safetensors, httpx, h11, click, prometheus-client, pygments, packaging, CUDA 13's nvidia-*)
WHEELS=(mlx==0.32.4 mlx-cuda-13==0.32.4 mlx-lm==0.32.2 starlette==1.10.0 uvicorn==0.54.0 msgspec==0.22.0
    python-dotenv==1.2.4 llguidance==1.9.1 anyio==4.16.0 typing-extensions==4.16.0 pytest==9.2.0 pluggy==1.7.0
    iniconfig==2.3.1 openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 jiter==0.19.0
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 sniffio==1.3.1)

prepare() {
    local platforms=() n
    for n in 35 34 31 28 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
    rm -rf .whl .whl-first && mkdir -p .whl .whl-first
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" --platform manylinux2014_x86_64 --platform any -d .whl "${WHEELS[@]}" || exit 1
    sha256sum ".whl/$CUDA_WHEEL" | cut -d' ' -f1 >".whl/$CUDA_WHEEL.sha256"
    split -b 48M ".whl/$CUDA_WHEEL" ".whl/$CUDA_WHEEL.part-" && rm ".whl/$CUDA_WHEEL"
    mv ".whl/$CUDA_WHEEL.part-aa" .whl-first/
    local exclude
    exclude=$(git rev-parse --git-path info/exclude) && mkdir -p "$(dirname "$exclude")" &&
        { grep -qx '/.whl/' "$exclude" 2>/dev/null || printf '/.whl/\n/.whl-first/\n' >>"$exclude"; }
    du -sh .whl .whl-first
}

case ${1:-run} in
    prepare) prepare; exit ;;
    stash) mkdir -p "$STASH" && cp .whl-first/* "$STASH"/ && ls -l "$STASH"; exit ;;
    run) ;;
    *) echo "usage: bash bench/gpu_ranks.sh [prepare|stash|run]" >&2; exit 2 ;;
esac

began=$SECONDS
results=()
step() { # NAME EXPECT(pass|fail) SECONDS SHELL-COMMAND: run it bounded, record whether it did what was expected
    local name=$1 expect=$2 limit=$3 rc
    echo "=== $name (expected to $expect) ==="
    timeout -k 5 "$limit" bash -c "$4"  # timeout signals its whole process group: mlx.launch's ranks too
    rc=$?
    if { [[ $expect == pass ]] && ((rc == 0)); } || { [[ $expect == fail ]] && ((rc != 0 && rc != 124)); }; then
        results+=("OK    $name (exit $rc)")
    else
        results+=("WRONG $name (exit $rc$( ((rc == 124)) && echo ', timed out'), expected to $expect)")
    fi
}
summary() {
    echo
    echo "=== summary ($((SECONDS - began)) s; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)) ==="
    printf '%s\n' "${results[@]}"
    ! printf '%s\n' "${results[@]}" | grep -q '^WRONG'
}

mkdir -p "$STASH" && cp .whl/* "$STASH"/
if compgen -G "$STASH/$CUDA_WHEEL.part-*" >/dev/null; then
    cat "$STASH/$CUDA_WHEEL".part-* >"$STASH/$CUDA_WHEEL" && rm "$STASH/$CUDA_WHEEL".part-*
    [[ $(sha256sum "$STASH/$CUDA_WHEEL" | cut -d' ' -f1) == $(cat "$STASH/$CUDA_WHEEL.sha256") ]] ||
        { echo "the joined $CUDA_WHEEL is damaged: run 'stash' with .whl-first, then this, on one warm machine"; exit 1; }
fi
python3 -m venv --without-pip .venv || exit 1
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
base=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$base" >"$site/machine-packages.pth"
ln -sfn "$base/nvidia" "$site/nvidia"  # libmlx.so's RPATH: $ORIGIN/../../nvidia/{cu13,cublas,cudnn,nccl,...}/lib
LD_LIBRARY_PATH=$(printf '%s:' "$base"/nvidia/*/lib)${LD_LIBRARY_PATH:-}  # and where a layout differs
python3 -m pip --python .venv/bin/python install -q --no-index --no-deps --no-compile "$STASH"/*.whl || exit 1
echo "installed in $((SECONDS - began)) s"
export LD_LIBRARY_PATH PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PY=.venv/bin/python
# the machine's own transformers and friends are other versions than CI's: their deprecations are not this run's
export PYTEST='.venv/bin/python -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning -W ignore::FutureWarning'
: >/tmp/gpu-ranks.env  # no .env of anyone's

step "the GPU is MLX's default device" pass 60 '$PY -c "
import mlx.core as mx
print(\"mlx\", mx.__version__, \"default device\", mx.default_device())
assert mx.default_device() == mx.gpu, \"the CPU is the default device: nothing below would say anything of a Mac\"
mx.eval(mx.ones((256, 256)) @ mx.ones((256, 256)))"'
[[ ${results[0]} == OK* ]] || { summary; exit 1; }

cat >/tmp/gpu_ranks_control.py <<'PYEOF'
import sys
import mlx.core as mx
from mlx_lm.generate import generation_stream
group = mx.distributed.init(strict=True, backend="ring")
x = mx.ones((1024,)) * (group.rank() + 1)  # made on the GPU, as a model layer's output
if sys.argv[1] == "gpu-stream":  # what the plan channel did before: the collective on the generation stream
    out = mx.distributed.all_sum(x, group=group, stream=generation_stream)
else:  # as mlx-lm's layers and our channel now build it: no stream, under the generation stream
    with mx.stream(generation_stream):
        out = mx.distributed.all_sum(x, group=group)
mx.eval(out)
assert out[0].item() == 3.0, out[0].item()
print("rank", group.rank(), "all_sum", out[0].item())
PYEOF
# mlx.launch exits 0 whatever its ranks did: judge by the ranks' own lines
control='.venv/bin/mlx.launch --hosts 127.0.0.1,127.0.0.1 --backend ring --starting-port $0 -- $PY \
    /tmp/gpu_ranks_control.py $1 2>&1 | tee /tmp/gpu_ranks_control.log
    [[ $(grep -c "^rank [01] all_sum 3.0" /tmp/gpu_ranks_control.log) == 2 ]]'
step "control: all_sum of GPU data, no stream, under the generation stream" pass 40 "bash -c '$control' 47110 cpu"
step "control: all_sum handed the generation stream (the Mac's bug) fails here too" fail 40 \
    "bash -c '$control' 47130 gpu-stream"
step "unit: the channel's and the probe's collectives, spied; the source rule" pass 60 \
    '$PYTEST tests/integration/test_collective_streams.py tests/unit/test_collective_source.py'
step "check --links, 2 local ranks" pass 60 'HOSTS=127.0.0.1,127.0.0.1 BACKEND=ring RING_PORT=47150 \
    ENV_FILE=/tmp/gpu-ranks.env RUN_DIR=/tmp/gpu-ranks-run $PY -m ops check --links'
step "multirank: check --links, the link probe, the engine on two ranks" pass 150 \
    '$PYTEST tests/multirank/test_check_links.py tests/multirank/test_links_two_ranks.py \
    tests/multirank/test_two_ranks.py'
summary
