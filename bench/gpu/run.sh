#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The one script a session lent a GPU machine runs there (issue 30's checks), from the
# repository root, after packing here:
#
#   ../shared/gpu/pack.sh build .gpu build/kdn build/tests/kernels/kernels_test build/tests/store/store_test \
#     build/tests/codec/tc_test build/tests/capi/capi_blend_test build/tests/blend/blend_test
#   (device) bash bench/gpu/run.sh .gpu           # writes everything under $OUT (default: out-gpu)
#
# It runs the GPU tests (the CUDA instances of the device tests, the codec and tc kernels, the
# view and RoPE kernels) with JUnit XML, then `kdn bench gpu` at Llama-3.1-8B's shape (8,192,
# 4,096 and 16,384 tokens; blending at the first) and on the reference model, and `kdn bench
# rag`'s GPU rows (bench/studies/rag_gpu_study.py), as JSON records; each step's output and exit status
# go to $OUT/summary.txt. A failing step does not stop the next: the machine's minutes are few.
set -uo pipefail
pack=${1:-.gpu}
out=${OUT:-out-gpu}
mkdir -p "$out"
# shellcheck disable=SC1091
source "$pack/env.sh"
summary=$out/summary.txt
: > "$summary"
step() {  # step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s: $(tail -1 "$out/$name.log")" >> "$summary"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.csv" 2>&1
step kernels_test 90 "$pack/bin/kernels_test" --gtest_output=xml:"$out/kernels_test.xml" \
  --gtest_filter='CodecDevice*:KvViewCuda*:RopeCuda*:CodecDeviceEmulation*'
step tc_test 60 "$pack/bin/tc_test" --gtest_output=xml:"$out/tc_test.xml" --gtest_filter='TcDevice*:TcCpu*'
step capi_blend_test 60 "$pack/bin/capi_blend_test" --gtest_output=xml:"$out/capi_blend_test.xml" \
  --gtest_filter='BlendDevice*'
step blend_test 60 "$pack/bin/blend_test" --gtest_output=xml:"$out/blend_test.xml" --gtest_filter='DeviceCompose*'
step store_test 120 "$pack/bin/store_test" --gtest_output=xml:"$out/store_test.xml" --gtest_filter='*/Cuda:DeviceViews*'
step bench_gpu_8b 300 "$pack/bin/kdn" bench gpu --shape llama-8b --tokens 8192 4096 16384 --repeats 5 --json "$out/gpu_llama8b.json"
# `kdn bench rag`'s GPU rows (docs/rag.md): the paper's 8K + 2K request on a Llama-3.1-8B-shaped
# model in PyTorch, composed with kdn's delivery and blending records above.
step rag_gpu 180 env PYTHONUNBUFFERED=1 python3 bench/studies/rag_gpu_study.py --kdn-json "$out/gpu_llama8b.json" \
  --out "$out/rag_gpu.json"
step bench_gpu_ref 60 "$pack/bin/kdn" bench gpu --shape ref --json "$out/gpu_ref.json"
cat "$summary"
