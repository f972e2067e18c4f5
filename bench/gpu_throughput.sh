#!/usr/bin/env bash
# Throughput at c = 1, 8, 32 on a Linux machine with one NVIDIA GPU and MLX's CUDA build: our server against
# in-process mlx-lm (stream_generate, BatchGenerator) and mlx_lm.server, side by side, taking turns
# (bench.interleaved), for SmolLM2-135M-Instruct and for a random-weight 4-bit model of Llama-3-8B's shape
# (bench.random_checkpoint, made there: no download); then SmolLM2's needle at 1k-8k tokens on 1 and 2 ranks
# (bench.needle). Per-step overhead shows only at realistic step times, and an 8k prefill in seconds, which this
# 2-core CPU box cannot give. Not part of CI.
#
#   bash bench/gpu_throughput.sh prepare   # here, with PyPI and the converted SmolLM2: .gpu-part1 .. .gpu-part4
#   bash bench/gpu_throughput.sh stash     # there, calls 1-3 at once, carrying .gpu-part1, 2, 3 (one each)
#   bash bench/gpu_throughput.sh           # there, call 4 at once, carrying .gpu-part4: install, run, print
#   bash bench/gpu_throughput.sh --dry     # here: the same run on the CPU with a tiny random model, few tokens
#
# What travels: gpu_ranks.sh's wheels (mlx-cuda-13 whole, 86 MiB) and the converted SmolLM2 folder (96 MB of
# 4-bit weights that do not compress), ~190 MiB in one tar, split into four parts under a call's 64 MiB. Every
# call stashes what it carries in /tmp on the machine, which keeps it while warm. The machine's own python3
# holds numpy, transformers, tokenizers, httpx and CUDA 13's libraries; the venv sees them, as gpu_ranks.sh's.
set -uo pipefail
cd "$(dirname "$0")/.."

STASH=/tmp/gpu-throughput
PARTS=4
SMOLLM2=${SMOLLM2:-$HOME/.cache/mlx-cluster-serve/smollm2-135m-v1}
# a few requests each, to fit ~5 minutes on an H200 with both models' loads (3 of each: ours, mlx_lm.server, here)
ROUNDS=${ROUNDS:-2} MAX_TOKENS=${MAX_TOKENS:-64} CONCURRENCY=${CONCURRENCY:-8,32}

prepare() {
    [[ -f $SMOLLM2/model.safetensors ]] || { echo "no converted SmolLM2 in $SMOLLM2: run ./launch.sh setup"; exit 1; }
    bash bench/gpu_ranks.sh prepare >/dev/null || exit 1
    local bundle
    bundle=$(mktemp -d)
    mkdir -p "$bundle/whl" "$bundle/smollm2" && cp .whl/* .whl-first/* "$bundle/whl/" && cp "$SMOLLM2"/* "$bundle/smollm2/"
    rm -rf .gpu-part* && mkdir -p .gpu-parts
    tar -C "$bundle" -cf "$bundle.tar" whl smollm2 && split -n "$PARTS" -d -a 1 "$bundle.tar" .gpu-parts/bundle.tar.
    rm -rf "$bundle" "$bundle.tar"
    (cd .gpu-parts && cat bundle.tar.* | sha256sum | cut -d' ' -f1 >bundle.sha256)
    for i in $(seq 1 "$PARTS"); do
        mkdir -p ".gpu-part$i" && mv ".gpu-parts/bundle.tar.$((i - 1))" ".gpu-part$i/" &&
            cp .gpu-parts/bundle.sha256 ".gpu-part$i/"
    done
    rm -rf .gpu-parts
    local exclude
    exclude=$(git rev-parse --git-path info/exclude) && mkdir -p "$(dirname "$exclude")" &&
        { grep -qx '/.gpu-part\*/' "$exclude" 2>/dev/null || printf '/.gpu-part*/\n' >>"$exclude"; }
    du -sh .gpu-part*
}

stash() { # copy whatever part this call carried into the machine's /tmp
    mkdir -p "$STASH"
    compgen -G ".gpu-part*/bundle.tar.*" >/dev/null && cp .gpu-part*/* "$STASH"/
    ls -l "$STASH"
}

dry=0
case ${1:-run} in
    prepare) prepare; exit ;;
    stash) stash; exit ;;
    run) ;;
    --dry) dry=1 ;;
    *) echo "usage: bash bench/gpu_throughput.sh [prepare|stash|run|--dry]" >&2; exit 2 ;;
esac

began=$SECONDS
if ((dry)); then
    PY=${PY:-.venv/bin/python} ROUNDS=1 MAX_TOKENS=8 CONCURRENCY=8 work=$(mktemp -d)
    shapes=(tiny) smollm2=$SMOLLM2 real=()  # SmolLM2 itself takes minutes on this CPU: the tiny model tries the path
else
    stash
    have=$(compgen -G "$STASH/bundle.tar.*" | wc -l)
    ((have == PARTS)) || { echo "$have of $PARTS parts stashed: run 'stash' carrying each missing .gpu-partN first"; exit 1; }
    [[ $(cat "$STASH"/bundle.tar.* | sha256sum | cut -d' ' -f1) == $(cat "$STASH/bundle.sha256") ]] ||
        { echo "the joined parts are damaged: run 'prepare' here again and carry all four"; exit 1; }
    work=/tmp/gpu-throughput-run && rm -rf "$work" && mkdir -p "$work"
    cat "$STASH"/bundle.tar.* | tar -C "$work" -xf - || exit 1
    whl=$work/whl
    cuda=$(compgen -G "$whl/mlx_cuda_13-*.whl.part-aa") && cat "${cuda%.part-aa}".part-* >"${cuda%.part-aa}" &&
        rm "${cuda%.part-aa}".part-*
    python3 -m venv --without-pip .venv || exit 1
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    base=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$base" >"$site/machine-packages.pth"
    ln -sfn "$base/nvidia" "$site/nvidia"  # libmlx.so's RPATH: $ORIGIN/../../nvidia/{cu13,cublas,...}/lib
    export LD_LIBRARY_PATH=$(printf '%s:' "$base"/nvidia/*/lib)${LD_LIBRARY_PATH:-}
    python3 -m pip --python .venv/bin/python install -q --no-index --no-deps --no-compile "$whl"/*.whl || exit 1
    PY=.venv/bin/python shapes=(llama3-8b) smollm2=$work/smollm2 real=("$work/smollm2")
    echo "installed in $((SECONDS - began)) s; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
    $PY -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device())' || exit 1
fi
export PYTHONUNBUFFERED=1 WATCHDOG_TIMEOUT=600 PY

bench() { # MODEL-FOLDER LABEL: the interleaved run, bounded (SIGINT: it stops its servers), its tables under a heading
    echo; echo "## $2 ($(date -u +%H:%M:%S), $(($SECONDS - began)) s in)"
    timeout -s INT -k 20 "${LIMIT:-120}" $PY -m bench.interleaved --model "$1" --rounds "$ROUNDS" --max-tokens "$MAX_TOKENS" \
        --concurrency "$CONCURRENCY" --quiet-wait 0 --out "$work/results" 2>&1 || echo "($2: exit $?)"
}
for folder in "${real[@]}"; do bench "$folder" "SmolLM2-135M-Instruct, 4-bit (its Q4_1 converted)"; done
for shape in "${shapes[@]}"; do
    echo; echo "generating a random $shape, 4-bit"
    timeout -k 10 120 $PY -m bench.random_checkpoint "$work/random-$shape" --shape "$shape" \
        --tokenizer-from "$smollm2" || { echo "generating $shape failed"; continue; }
    bench "$work/random-$shape" "random-weight $shape, 4-bit"
done
if ((!dry)); then  # an 8k prompt takes this CPU box many minutes to prefill; a GPU a second
    echo; echo "## needle, SmolLM2, 1 and 2 ranks ($(($SECONDS - began)) s in)"
    timeout -s INT -k 20 "${NEEDLE_LIMIT:-90}" $PY -m bench.needle --model "$smollm2" --ranks 1,2 \
        --lengths 1000,2000,4000,8000 --out "$work/results" 2>&1 | grep -v '^\[needle\]' || echo "(needle: exit $?)"
fi
echo; echo "done in $((SECONDS - began)) s"
