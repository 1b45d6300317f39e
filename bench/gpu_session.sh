#!/usr/bin/env bash
# Runs the GPU tests and benchmarks of a bundle (scripts/bundle) on a GPU host, one step after another,
# each under its own time limit, writing a log per step into $OUT (default ./gpu-logs). For the device
# machine, where one call has a few minutes:
#   bench/gpu_session.sh BUNDLE [tests|kernels|seed|all] [gtest filter]
set -uo pipefail
bundle=${1:?usage: bench/gpu_session.sh BUNDLE [tests|kernels|seed|all] [gtest filter]}
what=${2:-all}
filter=${3:-*}
out=${OUT:-gpu-logs}
mkdir -p "$out"
run() {  # name limit command...
  local name=$1 limit=$2
  shift 2
  echo "== $name ($(date +%T))"
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$out/$name.log"
  echo "== $name exit $rc"
}
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
if [ "$what" = tests ] || [ "$what" = all ]; then
  run gpu_tests ${TESTS_LIMIT:-330} "$bundle/run" gpu_tests --gtest_brief=1 --gtest_filter="$filter"
fi
if [ "$what" = kernels ] || [ "$what" = all ]; then
  run expert_gpu_bench ${KERNELS_LIMIT:-200} "$bundle/run" strata-expert-gpu-bench --repeats=20
fi
if [ "$what" = seed ] || [ "$what" = all ]; then
  pack=${SEED_PACK:-/tmp/strata-seed-s2}
  [ -d "$pack" ] || run synth_seed 300 "$bundle/run" strata-pack synth --arch qwen3moe --preset seed --pack-only \
    --scheme s2 --out "$pack"
  run decode_gpu_bench 420 "$bundle/run" strata-decode-gpu-bench --pack "$pack" --concurrency=1,8,32 \
    --prefill=512,4096 --prefill-chunk=${PREFILL_CHUNK:-1024}
fi
