#!/usr/bin/env bash
# One call on the lent GPU machine: install the carried wheels and the project, run the GPU test tier, the
# resident benchmark and (with PROBE=1) the probe; logs/JSON under $OUT, a short table last.
#   device run, carry [".whl"]:  bash scripts/gpu_check.sh
# Env: TESTS (pytest paths; "none" skips), TEST_TIMEOUT, BENCH=0 (no resident bench), BENCH_ARGS (run
# `qwenlocal bench $BENCH_ARGS` instead), BENCH_TIMEOUT, BENCH_TAIL, COPY=1 (expert-copy GB/s), PROFILE=1, PROFILE_PREFILL=1, OVERLAP_BENCH=1 (OVERLAP_TIMEOUT, OVERLAP_ARGS),
# EXTRA_CMD (EXTRA_TIMEOUT), DEADLINE (s: the bench gets the rest), BENCH_NEEDS_TESTS=1, PROFILE_PREFILL_ARGS, PROBE=1,
# PROFILE_DECODE_ARGS (run scripts/profile_decode.py with them first; PROFILE_DECODE_TIMEOUT),
# NCU=1 (Nsight Compute over one eager decode step, scripts/ncu_decode.py with NCU_ARGS; NCU_TIMEOUT, NCU_FILTER,
# NCU_SECTIONS).
# Order: profile_decode, ncu, tests, copy, overlap, extra, bench, profiles (TESTS_FIRST=1: tests before profile_decode).
# Kernel caches: a carried .cache-carry/kcache.tgz.* (from an earlier call's $OUT) is unpacked before anything
# compiles, and the caches are packed again into $OUT/kcache.tgz.* (15 MiB pieces) at the end (KCACHE_SAVE=0: not).
# Every other file of $OUT comes back in $OUT/results.tgz (the device returns 8 files at most).
set -uo pipefail
T_START=$(date +%s)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target /tmp/site . || exit 1
# FlashInfer's JIT builds with ninja, which rebuilds a module whose sources are newer than its objects, and every
# install above gives the sources a new mtime: one fixed old date keeps a carried (or this warm machine's) build
# current. Without it session 27's warm calls compiled the small model's prefill module again (>100 s each).
# Python files keep their mtimes (their bytecode caches are checked against them).
find /tmp/site -type f ! -name '*.py' ! -name '*.pyc' -exec touch -h -d '2001-01-01 00:00:00' {} + 2>/dev/null
export QWENLOCAL_HOME=$(mktemp -d)
# Triton, FlashInfer and fla JIT caches in one folder: a fresh machine compiles for ~2-3 min without them.
KCACHE=/tmp/kcache; mkdir -p "$KCACHE"
export TRITON_CACHE_DIR=$KCACHE/triton FLASHINFER_WORKSPACE_BASE=$KCACHE/flashinfer
if ls .cache-carry/kcache.tgz.* >/dev/null 2>&1 && [ ! -e "$KCACHE/.restored" ]; then
  cat .cache-carry/kcache.tgz.* | tar -xzf - -C "$KCACHE" && touch "$KCACHE/.restored" && echo "kernel caches restored: $(du -sh $KCACHE | cut -f1)"
fi
profile_decode() {
  [ -n "${PROFILE_DECODE_ARGS:-}" ] || return 0
  timeout ${PROFILE_DECODE_TIMEOUT:-400} python3 scripts/profile_decode.py --json "$OUT/profile_decode.json" $PROFILE_DECODE_ARGS > "$OUT/profile_decode.log" 2>&1
  echo "profile_decode rc=$?"; grep -A40 "== summary ==" "$OUT/profile_decode.log" || tail -30 "$OUT/profile_decode.log"
}
# TESTS_FIRST=1: the pytest tier before profile_decode (a profile killed at its timeout inside FlashInfer's JIT
# build left the tests of sessions 22's calls 2 and 3 to rebuild the small model's module for >100 s).
[ "${TESTS_FIRST:-0}" = 1 ] || profile_decode
if [ "${NCU:-0}" = 1 ]; then
  # Why each kernel takes its time: one eager step's kernels replayed with the caches flushed, clocks left free
  # (METHOD.md); the raw CSV comes back in results.tgz, its summary (scripts/ncu_summary.py) is printed here.
  NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  # NCU_FILTER: ncu's kernel filter and count (e.g. '-k regex:"expert_gate_up|gemv_mixed" -c 8'; the whole step
  # takes ~1.3 s a kernel, 342 kernels); NCU_SECTIONS: more sections (e.g. "--section SourceCounters").
  timeout ${NCU_TIMEOUT:-400} "$NCU_BIN" --profile-from-start off --clock-control none --cache-control all \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats ${NCU_SECTIONS:-} \
    --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct ${NCU_FILTER:-} -f -o "$OUT/ncu_decode" \
    python3 scripts/ncu_decode.py ${NCU_ARGS:-} > "$OUT/ncu.log" 2>&1
  echo "ncu rc=$?"; tail -5 "$OUT/ncu.log"
  "$NCU_BIN" --import "$OUT/ncu_decode.ncu-rep" --page raw --csv > "$OUT/ncu_raw.csv" 2>>"$OUT/ncu.log" \
    && python3 scripts/ncu_summary.py "$OUT/ncu_raw.csv" --top 30 | tee "$OUT/ncu_summary.txt"
  if [[ "${NCU_SECTIONS:-}" == *SourceCounters* ]]; then
    # the per-instruction view (stall samples a SASS line) is not in the raw page: export it, and keep the report
    # (a few MB for a filtered run) for the Nsight Compute GUI
    "$NCU_BIN" --import "$OUT/ncu_decode.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu_source.csv" \
      2>>"$OUT/ncu.log" || echo "ncu: no source page exported (see ncu.log)"
  else
    rm -f "$OUT/ncu_decode.ncu-rep"  # ~MBs of binary; the CSV holds every metric it collected
  fi
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

t0=$(date +%s)
# SIGINT at the deadline: pytest then still prints each failure's reason (a plain kill left none in session 21)
[ "${TESTS:-}" = none ] || timeout -s INT -k 20 ${TEST_TIMEOUT:-900} python3 -m pytest -v -s -p no:cacheprovider ${TESTS:-tests/test_gpu_decode_fused.py tests/test_kernels_gemv_multi.py tests/test_kernels_decode_fused.py tests/test_kernels_gdn_decode.py tests/test_kernels_nvfp4_experts_decode.py tests/test_gpu_flashinfer_plan.py tests/test_gpu_no_sync.py tests/test_kernels_dequant.py tests/test_fp8_scaled_mm.py tests/test_slot_ensure.py tests/test_gpu_offload.py tests/test_gpu_overlap.py tests/test_gpu_runtime.py tests/test_kernels_moe.py tests/test_kernels_nvfp4.py tests/test_kernels_nvfp4_grouped.py tests/test_nvfp4_experts.py::test_quant_linear_gemv_and_blocked_prefill_match_the_dequantized_matmul tests/test_prefill_kernels.py tests/test_kernels_pair_sum.py tests/test_kernels_nvfp4_experts_parts.py tests/test_gemv_prefetch.py tests/test_kernels_router_gemv.py tests/test_kernels_gemv_norm.py tests/test_kernels_parts_norm.py tests/test_kernels_gdn_tail.py tests/test_kernels_gemv_mixed.py tests/test_kernels_attention_decode.py tests/test_gpu_gdn_graph.py tests/test_gpu_generate.py tests/test_kernels_router_norm.py tests/test_gpu_attention_pairs.py tests/test_gpu_fa2_path.py tests/test_kernels_nvfp4_int_dot.py tests/test_kernels_nvfp4_int_experts.py tests/test_kernels_nvfp4_int_groups.py tests/test_kernels_fp8_mma.py tests/test_down_prefetch.py tests/test_kernels_sample_fused.py} 2>&1 | tee "$OUT/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}
t1=$(date +%s)
[ "${TESTS_FIRST:-0}" = 1 ] && profile_decode
bench_rc=skipped
if [ "${COPY:-0}" = 1 ]; then
  timeout 120 python3 scripts/bench_expert_copy.py --out "$OUT" 2>&1 | tee "$OUT/expert_copy.log"
fi
if [ "${OVERLAP_BENCH:-0}" = 1 ]; then
  timeout ${OVERLAP_TIMEOUT:-300} python3 scripts/overlap_microbench.py --out "$OUT" ${OVERLAP_ARGS:-} 2>&1 | tee "$OUT/overlap_bench.log"
fi
if [ -n "${EXTRA_CMD:-}" ]; then  # one more program before the bench (e.g. a kernel benchmark)
  timeout ${EXTRA_TIMEOUT:-150} bash -c "$EXTRA_CMD" 2>&1 | tee "$OUT/extra.log"
fi
if [ -n "${DEADLINE:-}" ]; then  # the bench gets what is left of DEADLINE seconds (it saves a partial result)
  BENCH_TIMEOUT=$(( DEADLINE - ($(date +%s) - T_START) ))
fi
if [ -n "${BENCH_ARGS:-}" ] && [ "${BENCH_NEEDS_TESTS:-0}" = 1 ] && [ "$tests_rc" != 0 ]; then
  echo "bench skipped: the tests failed (BENCH_NEEDS_TESTS=1)"
elif [ -n "${BENCH_ARGS:-}" ]; then
  # `qwenlocal bench` with these arguments (wide table: the log is not a terminal)
  COLUMNS=240 timeout -s INT -k 30 ${BENCH_TIMEOUT:-900} python3 -m qwenlocal.app.cli bench --out "$OUT" $BENCH_ARGS 2>&1 | tee "$OUT/bench.log"
  bench_rc=${PIPESTATUS[0]}
elif [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-900} python3 scripts/bench_resident.py --out "$OUT" 2>&1 | tee "$OUT/bench.log"
  bench_rc=${PIPESTATUS[0]}
  if [ "${PROFILE:-0}" = 1 ]; then python3 scripts/profile_decode.py 2>&1 | tee "$OUT/profile.log" | tail -40; fi
fi
if [ "${PROFILE_PREFILL:-0}" = 1 ]; then
  # not `tee | head`: head's exit would cut the log and kill the profiler with SIGPIPE before its last report
  timeout ${PROFILE_TIMEOUT:-400} python3 scripts/profile_prefill.py ${PROFILE_PREFILL_ARGS:-16384} > "$OUT/profile_prefill.log" 2>&1
  head -60 "$OUT/profile_prefill.log"
fi
t2=$(date +%s)
probe_rc=skipped
if [ "${PROBE:-0}" = 1 ]; then
  python3 scripts/gpu_probe.py --out "$OUT" --full 2>&1 | tee "$OUT/probe.log"
  probe_rc=${PIPESTATUS[0]}
fi

if [ "${KCACHE_SAVE:-1}" = 1 ]; then
  # Triton needs only each kernel's .cubin and .json (its group file drops missing children): the IR stages
  # are ~3/4 of the packed size. FlashInfer's .o files stay (ninja rebuilds a .so whose objects are missing).
  find "$KCACHE/triton" -type f \( -name '*.ptx' -o -name '*.llir' -o -name '*.ttir' -o -name '*.ttgir' \
    -o -name '*.source' \) -delete 2>/dev/null
  (cd "$KCACHE" && tar --exclude=.restored -czf - . | split -b 15m -d - "$OUT/kcache.tgz.")
  echo "kernel caches packed: $(ls "$OUT"/kcache.tgz.* | wc -l) piece(s), $(du -ch "$OUT"/kcache.tgz.* | tail -1 | cut -f1)"
fi

echo
echo "== summary =="
printf "%-28s %s\n" "gpu tier (pytest)" "rc=$tests_rc, $((t1 - t0)) s: $(tail -n 1 "$OUT/gpu_tests.log")"
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20
printf '%-28s %s\n' "bench" "rc=$bench_rc, $((t2 - t1)) s"
[ -f "$OUT/bench.log" ] && tail -n ${BENCH_TAIL:-5} "$OUT/bench.log"
[ -f "$OUT/expert_copy.log" ] && cat "$OUT/expert_copy.log"
printf '%-28s %s\n' "probe" "rc=$probe_rc"

# The device returns at most 8 files from $OUT (the kernel-cache pieces are two of them): every log and JSON goes
# back in one archive, the summary above having read them.
(cd "$OUT" && find . -maxdepth 1 -type f ! -name 'kcache.tgz.*' ! -name results.tgz -printf '%P\n' \
  | tar -czf results.tgz -T - && find . -maxdepth 1 -type f ! -name 'kcache.tgz.*' ! -name results.tgz -delete)
echo "logs: \$OUT/results.tgz ($(tar -tzf "$OUT/results.tgz" | wc -l) files)"
