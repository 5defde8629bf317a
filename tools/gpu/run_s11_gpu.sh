#!/usr/bin/env bash
# The eleventh session's GPU runs (issue 4: the DSA indexer's top-k at 128K keys, batch 1 / 8) in
# one call, over a stage made as run_all_gpu.sh's header says (a partial stage is fine for the
# steps that need only some binaries):
# - idxprof: where IndexerTopK's time goes: Nsight Compute's gpu__time_duration per launch of
#   cuda_indexer_bench's 1 x 128K and 8 x 128K cases (random data), the CSV in $OUT/idx_ncu.csv,
#   and the batch-1 decode step's kernels at 128K (profile_decode.sh, eager; its cached scores
#   all tie);
# - idxhbm: the score kernel with its keys from HBM (ncu's cache flush): cuda_indexer_bench's
#   1 / 8 x 128K cases per kernel launch ($OUT/idx_hbm.csv), and ncu's full set on the batch-1
#   128K decode step's score kernel;
# - idxbench: cuda_indexer_bench at IDX_ROWS (default 1,8,64) rows x 4K / 128K keys (every path,
#   A/B in one process);
# - idxtest: cuda_indexer_test alone, then compute-sanitizer memcheck and racecheck on its
#   SanitizerSubset cases;
# - tests: every GPU test binary and the memcheck cases (run_all_gpu.sh STEPS="tests memcheck");
# - decode: glm-bench-cuda-decode at GLM-5 widths, fp8 weights and KV, 1 vs 6 layers, graphs on,
#   BATCHES (default 1,2,8) at 4K and 128K (AB="--ab NAME" appended when set, or ABS="NAME ..."
#   one process per A/B; this session's: ABS="indexer idxctas idxahead idxwide");
# - profile: the batch-1 per-kernel profile at 4K (profile_decode.sh, ncu, eager).
# From the repo root there (carry the pack): tar -xJf .gpurun-pack/all.tar.xz &&
#   STEPS="..." tools/gpu/run_s11_gpu.sh .gpurun-all
# Logs in $OUT (default /tmp/glm-s11-out). STEPS (default "idxprof idxbench").
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu/common.sh
gpu_run_begin "${1:-.gpurun-all}" "${OUT:-/tmp/glm-s11-out}"
steps=${STEPS:-idxprof idxbench}
GPU_STEP_GREP="^== (decode step|summary)|^ +[0-9]+ +[0-9]+ +(fp8|[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+)|^\[  (PASSED|FAILED) |rc=|^\| |^(topk|select)|ERROR SUMMARY|RACECHECK SUMMARY| us +[0-9]+x"
GPU_STEP_HEAD=120
decode_args=(--dtype fp8 --kv-dtype fp8 --layers 1,6 --steps 16 --graphs on)
for s in $steps; do
  case $s in
    idxprof)
      gpu_step "idx-ncu" 300 ncu --metrics gpu__time_duration.sum --clock-control none \
        --cache-control none --csv --log-file "$out/idx_ncu.csv" -k 'regex:Indexer' \
        "$bin/cuda_indexer_bench" --rows 1,8 --keys 131072 --trials 1 --calls 2
      gpu_step "profile-128k" 300 env OUT="$out/prof128k" \
        NCU_FLAGS="--clock-control none --cache-control none" \
        tools/gpu/profile_decode.sh "$stage" 1 --kv-dtype fp8 --graphs off --contexts 131072
      ;;
    idxhbm)
      # The score kernel reading its keys from HBM (ncu flushes the caches before each kernel, as
      # in a decode step where the layer's weights evict them), every path and chunk sizing of
      # cuda_indexer_bench at 1 / 8 x 128K; then Nsight Compute's full set on the batch-1 128K
      # decode step's score kernel (random KV).
      gpu_step "idx-ncu-hbm" 300 ncu --metrics gpu__time_duration.sum --clock-control none \
        --csv --log-file "$out/idx_hbm.csv" -k 'regex:IndexerScoreTc' \
        "$bin/cuda_indexer_bench" --rows 1,8 --keys 131072 --trials 1 --calls 2
      gpu_step "ncu-score-full" 300 ncu --set full --import-source no -k 'regex:IndexerScoreTc' \
        --launch-skip 1 --launch-count 1 "$bin/glm-bench-cuda-decode" --layers 1 --batches 1 \
        --contexts 131072 --dtype fp8 --kv-dtype fp8 --steps 2 --warmup 1 --graphs off
      ;;
    idxbench)
      gpu_step "idxbench" 300 "$bin/cuda_indexer_bench" --rows "${IDX_ROWS:-1,8,64}" \
        --keys 4096,131072 --trials 3
      ;;
    idxtest)
      gpu_step "cuda_indexer_test" 300 "$bin/cuda_indexer_test"
      gpu_step "memcheck-indexer" 400 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$bin/cuda_indexer_test" --gtest_filter='*SanitizerSubset*'
      gpu_step "racecheck-indexer" 400 compute-sanitizer --tool racecheck --error-exitcode 9 \
        "$bin/cuda_indexer_test" --gtest_filter='*SanitizerSubset*'
      ;;
    tests)
      gpu_tests_step
      ;;
    decode)
      # ABS: A/B names run one after the other (one process each); else AB ("--ab NAME" or
      # empty) once.
      if [[ -n ${ABS:-} ]]; then
        for ab in $ABS; do
          gpu_step "decode-$ab" 330 "$bin/glm-bench-cuda-decode" "${decode_args[@]}" \
            --batches "${BATCHES:-1,2,8}" --contexts 4096,131072 --ab "$ab"
        done
      else
        # shellcheck disable=SC2086  # AB: "--ab NAME" or empty
        gpu_step "decode" 330 "$bin/glm-bench-cuda-decode" "${decode_args[@]}" \
          --batches "${BATCHES:-1,2,8}" --contexts 4096,131072 ${AB:-}
      fi
      ;;
    profile)
      gpu_profile_step 1
      ;;
    *) echo "unknown step $s (idxprof, idxhbm, idxbench, idxtest, tests, decode, profile)" ;;
  esac
done
gpu_run_end
