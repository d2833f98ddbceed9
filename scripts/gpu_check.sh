#!/usr/bin/env bash
# The GPU checks, as one call on a lent GPU machine (the workplace's `device` tool), which is
# bare, offline and held for minutes: nmt's own dependencies that its image lacks travel as
# wheels in .whl/ and Multi30k in .gpu/shared/data/multi30k (both ignored, carried), and each
# stage below writes its log into $OUT and prints the log's end, whatever the stages before
# it did. Stages (any subset, in this order): env, cuda (tests/test_cuda.py and
# tests/test_gpu_paths.py), syncs (host syncs and tokens/s of the reference model's update,
# scripts/profile_step.py), bench (scripts/compare_peers.py's nmt rows on the GPU for
# $BENCH_MINUTES each, against the GPU's limit), suite (the whole test suite), batches (the
# update's tokens/s at each batch size of $BATCHES in each of $PRECISIONS: how far a larger
# batch takes a launch-bound step, and whether bf16 pays there).
#
#     bash scripts/gpu_check.sh env cuda syncs bench suite batches
#
# Session 33's H100: env 9 s, suite 161 s, bench (0.3 min) 171 s, syncs (two precisions)
# 53 s; `env suite bench syncs` fits one call of about 430 s (cuda is inside suite).
# Set up beside the repository first (here, where pip reaches PyPI), both folders ignored by
# .gitignore: the wheels of the packages the image lacks, for its Python 3.12 (the
# versions of this checkout's .venv), and the data:
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#         --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#         -d .whl datasets sacremoses fastapi starlette pydantic pydantic_core uvicorn dill \
#         multiprocess annotated-types typing-inspection typing_extensions opentelemetry-api \
#         libretranslatepy pytest-timeout    # each pinned NAME==VERSION as `.venv/bin/pip list` has it
#     mkdir -p .gpu/shared/data && cp -r ../shared/data/{multi30k,tatoeba} .gpu/shared/data/
# On the H100 of session 30 the suite took over 170 s with 8 workers of 16 threads each (half
# of it ran); with 2 threads each, session 33's ran whole in 156 s. Its failures are named as
# they happen (-v), so a stage cut short still says.
set -u
BENCH_MINUTES=${BENCH_MINUTES:-0.5}
# each stage's time limit, within the call's own. Since session 34 compare_peers times the
# limit twice (before and after the nmt rows), not yet timed on a GPU: a cut-short bench
# still keeps its training figures (--redecode fills the rest)
BENCH_SECONDS=${BENCH_SECONDS:-400}
SUITE_SECONDS=${SUITE_SECONDS:-400}
SUITE_WORKERS=${SUITE_WORKERS:-8}  # pytest-xdist workers, each of SUITE_THREADS CPU threads:
SUITE_THREADS=${SUITE_THREADS:-2}  # torch's default (every core) in each oversubscribes them
SUITE_TESTS=${SUITE_TESTS:-}  # pytest's test ids: a part of the suite (a rerun of failures)
PRECISIONS=${PRECISIONS:-bf16 fp16 fp32}  # the syncs and batches stages'
BATCHES=${BATCHES:-64 256}  # the batches stage's sentences a batch
CUDA_TESTS=${CUDA_TESTS:-}  # pytest -k expression: a subset of the cuda stage's tests
for what in "$@"; do  # before installing anything
    case $what in
        env | cuda | syncs | bench | suite | batches) ;;
        *) echo "gpu_check.sh: unknown stage '$what': expected env, cuda, syncs, bench, suite" \
            "or batches"
            exit 2 ;;
    esac
done
[ $# -gt 0 ] || {
    echo "gpu_check.sh: name the stages: env cuda syncs bench suite batches"; exit 2; }
compgen -G ".whl/*.whl" >/dev/null || {
    echo "gpu_check.sh: no wheels in .whl/: download them first (this script's header)"; exit 2; }
# what it writes, in folders of its own: the logs ($OUT where the device tool sets it), the
# wheels' packages, compare_peers' work
scratch=$(mktemp -d)
OUT=${OUT:-$scratch/logs}
mkdir -p "$OUT"
echo "gpu_check.sh: logs in $OUT, packages in $scratch/site"
export PYTHONUNBUFFERED=1 NMT_DATA_DIR=../shared/data
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "$scratch/site" .whl/*.whl || exit 1
export PYTHONPATH=$scratch/site:$PWD:$PWD/scripts
# the suite reads ../shared/data: the carried copy, where there is no ../shared
[ -e ../shared ] || [ ! -d .gpu/shared ] || ln -s "$PWD/.gpu/shared" ../shared

stage() {  # stage NAME SECONDS COMMAND...: the command's output into $OUT/NAME.log
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    echo "=== $name: $*"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s"
    tail -n "${TAIL:-20}" "$OUT/$name.log"
}

syncs() {
    for precision in $PRECISIONS; do
        python3 scripts/profile_step.py configs/reference_rnn.yaml --precision "$precision" \
            --steps 40 --profile-steps 3 --top 12 || return
        python3 scripts/profile_step.py configs/reference_rnn.yaml --precision "$precision" \
            --steps 5 --count-syncs || return
    done
}
batches() {
    for batch in $BATCHES; do
        for precision in $PRECISIONS; do
            python3 scripts/profile_step.py configs/reference_rnn.yaml --precision "$precision" \
                --steps 30 --profile-steps 0 --set "train.batch_size=$batch" || return
        done
    done
}
export -f syncs batches
export PRECISIONS BATCHES

for what in "$@"; do
    case $what in
        env) stage env 60 bash -c 'nvidia-smi; lscpu | grep -E "Model name|^CPU\(s\)";
            python3 -c "import torch, nmt.cli, datasets, fastapi, uvicorn, sacremoses
print(torch.__version__, torch.cuda.get_device_name(), torch.cuda.get_device_capability())"' ;;
        cuda) stage cuda 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
            tests/test_gpu_paths.py ${CUDA_TESTS:+-k "$CUDA_TESTS"} ;;
        syncs) TAIL=60 stage syncs 150 bash -c syncs ;;
        batches) stage batches 150 bash -c batches ;;
        bench) TAIL=30 stage bench "$BENCH_SECONDS" python3 scripts/compare_peers.py \
            --only nmt-fp32,nmt-bf16,nmt-fp16 --minutes "$BENCH_MINUTES" --work "$scratch/peers" \
            --out "$OUT/bench.json" ;;
        suite) TAIL=3 stage suite "$SUITE_SECONDS" env OMP_NUM_THREADS="$SUITE_THREADS" \
            python3 -m pytest -v -p no:cacheprovider -n "$SUITE_WORKERS" --durations=15 \
            $SUITE_TESTS
            grep -E " (FAILED|ERROR) " "$OUT/suite.log" | head -n 30 ;;
    esac
done
