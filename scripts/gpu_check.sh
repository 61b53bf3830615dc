#!/usr/bin/env bash
# One call on the lent GPU machine: install the carried wheels and the project, run the GPU test tier and
# the probe, write logs/JSON under $OUT, print a short table last.
#   device run, carry [".whl"]:  bash scripts/gpu_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . || exit 1
export QWENLOCAL_HOME=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee "$OUT/commit.txt"

t0=$(date +%s)
python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/ 2>&1 | tee "$OUT/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}
t1=$(date +%s)
python3 scripts/gpu_probe.py --out "$OUT" --full 2>&1 | tee "$OUT/probe.log"
probe_rc=${PIPESTATUS[0]}
t2=$(date +%s)

echo
echo "== summary =="
printf '%-28s %s\n' "gpu tier (pytest -m gpu)" "rc=$tests_rc, $((t1 - t0)) s: $(tail -n 1 "$OUT/gpu_tests.log")"
printf '%-28s %s\n' "probe" "rc=$probe_rc, $((t2 - t1)) s"
grep -E "rel=|max abs=" "$OUT/gpu_tests.log" | sed 's/^/  /'
