#!/usr/bin/env bash
# Runs the GPU tests and benchmarks of a bundle (scripts/bundle) on a GPU host, one step after another,
# each under its own time limit, writing a log per step into $OUT (default ./gpu-logs). For the device
# machine, where one call has a few minutes:
#   bench/gpu_session.sh BUNDLE [tests|kernels|seed|profile|all] [gtest filter]
# profile (not part of all): where one batch-1 decode layer's time goes, with Nsight Compute: each kernel's
# duration and per-SM activity (a grid's work against one SM's tail), then warp-state samples at the
# finest interval, instruction by instruction, of the kernels named by PROFILE_KERNELS (a regex).
set -uo pipefail
bundle=${1:?usage: bench/gpu_session.sh BUNDLE [tests|kernels|seed|profile|all] [gtest filter]}
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
if [ "$what" = profile ]; then
  pack=${SEED_PACK:-/tmp/strata-seed-s2}
  [ -d "$pack" ] || run synth_seed 300 "$bundle/run" strata-pack synth --arch qwen3moe --preset seed --pack-only \
    --scheme s2 --out "$pack"
  decode=("$bundle/run" strata-decode-gpu-bench --pack "$pack" --concurrency=1 --prefill=64 --tokens=8 --vram-experts=-1)
  metrics=sm__cycles_active.avg,sm__cycles_active.max,gpc__cycles_elapsed.max,gpu__time_duration.sum
  run ncu_layer 150 ncu --clock-control none --cache-control none --metrics "$metrics" --launch-skip 1200 \
    --launch-count 20 --csv "${decode[@]}"
  run ncu_sampling 200 ncu --clock-control none --cache-control none --section SourceCounters \
    --warp-sampling-interval 0 -k "regex:${PROFILE_KERNELS:-RouterKernel}" --launch-skip 200 --launch-count 1 \
    --page source --print-source sass --csv "${decode[@]}"
fi
if [ "$what" = seed ] || [ "$what" = all ]; then
  pack=${SEED_PACK:-/tmp/strata-seed-s2}
  [ -d "$pack" ] || run synth_seed 300 "$bundle/run" strata-pack synth --arch qwen3moe --preset seed --pack-only \
    --scheme s2 --out "$pack"
  run decode_gpu_bench 420 "$bundle/run" strata-decode-gpu-bench --pack "$pack" --concurrency=1,8,32 \
    --prefill=512,4096 --prefill-chunk=${PREFILL_CHUNK:-1024}
fi
