#!/usr/bin/env bash
# The one prepared command for the device tool: run the GPU harness on the lent H200 and
# leave everything under $OUT (about 7 minutes; the harness stops starting new work at
# 400 s and the whole command is cut at 470 s, so it fits an 8-minute limit).
#
# From the developer's machine (the device tool copies the working tree, runs this in the
# repository root, and brings $OUT back):
#
#     run(command="bash calibration/gpu_bench/run_on_device.sh", timeout_s=500)
#
# Then, on the developer's machine, with the folder the tool reports as files_at:
#
#     python -m calibration.sources.gpu_ingest FILES_AT/bench          # -> calibration/data/h200-<date>.jsonl
#     tpusim calibrate --hardware h200 --measurements calibration/data/h200-<date>.jsonl \
#         --holdout kind=decode_step --json --out calib/h200
#     git add calibration/data/h200-<date>.jsonl               # the measured records, nothing else
#
# GPU_BENCH_SET=cpu runs the same script on a CPU at CI sizes (a dry run of the command).
# The lent machine's Python has JAX with CUDA but not pydantic, simpy or scipy: the harness
# needs only jax and numpy, and nothing here installs anything. Nothing changes the GPU's
# settings: nvidia-smi is only queried.
set -euo pipefail
: "${OUT:?OUT must name the folder the device tool brings back}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT/bench"
# Room for the largest replay (Qwen3-30B-A3B at batch 32 reads ~53 GB of weights) beside
# the rotating matmul and 4 GiB copy buffers; JAX's default is 75 % of the GPU's memory.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true; } \
    > "$OUT/nvidia-smi.csv" 2>&1
"$PYTHON" -c "import jax; print(jax.__version__, jax.devices())" > "$OUT/jax.txt" 2>&1
status=0
timeout 470 "$PYTHON" -m calibration.gpu_bench --out "$OUT/bench" --set "${GPU_BENCH_SET:-h200}" --budget-s 400 \
    > "$OUT/bench/stdout.txt" 2> "$OUT/bench/stderr.txt" || status=$?
# The loader reads only the trace-event files; the raw XSpace protobufs are large.
find "$OUT/bench/traces" -name '*.xplane.pb' -delete 2>/dev/null || true
echo "gpu_bench exit status $status; $(wc -l < "$OUT/bench/records.jsonl" 2>/dev/null || echo 0) records"
tail -n 5 "$OUT/bench/stderr.txt" || true
exit "$status"
