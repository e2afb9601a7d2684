#!/usr/bin/env bash
# The one prepared command for the device tool on a lent TPU v5e: install the project's
# pure-Python needs offline from carried wheels (.whl-tpu: pydantic, simpy, pyyaml, ...; the
# machine has JAX, libtpu, numpy and scipy), run a kernel set and then the chip probes, and
# leave everything under $OUT. From the developer's machine:
#
#     run(command="bash calibration/tpu_bench/run_on_device.sh v5e-a", carry=[".whl-tpu"], timeout_s=600)
#     python -m calibration.tpu_bench.ingest FILES_AT   # -> calibration/data/tpu-v5e-*.jsonl
#
# TPU_BENCH_BUDGET_S (default 420) stops starting kernel cases; the probes get what is left
# of TPU_BENCH_TOTAL_S (default 540), in their own process (a probe that crashes the core
# cannot cost the kernel records), and only when TPU_BENCH_PROBES is 1 (default);
# TPU_BENCH_PROBE_ARGS narrows them (e.g. "--probe dequant_fp8_gate_up --probe dequant_mxfp4_down").
set -uo pipefail
: "${OUT:?OUT must name the folder the device tool brings back}"
SET="${1:-smoke}"
START=$(date +%s)
if [ -d .whl-tpu ]; then
    PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target /tmp/site .whl-tpu/*.whl || exit 3
    export PYTHONPATH="${PYTHONPATH:-}:/tmp/site"
fi
export PYTHONPATH="$PYTHONPATH:$PWD" PYTHONUNBUFFERED=1
python3 -c "import jax, platform; print(jax.__version__, jax.devices(), platform.libc_ver())" > "$OUT/jax.txt" 2>&1
timeout $(( ${TPU_BENCH_TOTAL_S:-540} - 20 )) python3 -m calibration.tpu_bench.device_run --out "$OUT" --set "$SET" \
    --budget-s "${TPU_BENCH_BUDGET_S:-420}" > "$OUT/kernels.log" 2>&1
echo "kernel set $SET exit $?; $(wc -l < "$OUT/records.jsonl" 2>/dev/null || echo 0) records"
tail -n 60 "$OUT/kernels.log"
LEFT=$(( ${TPU_BENCH_TOTAL_S:-540} - ($(date +%s) - START) ))
if [ "${TPU_BENCH_PROBES:-1}" = 1 ] && [ "$LEFT" -gt 60 ]; then
    # shellcheck disable=SC2086  # TPU_BENCH_PROBE_ARGS: e.g. "--probe dequant_fp8_gate_up" (word-split on purpose)
    timeout $(( LEFT - 10 )) python3 -m calibration.tpu_bench run --no-slow --budget $(( LEFT - 40 )) \
        ${TPU_BENCH_PROBE_ARGS:-} --out "$OUT/probes.jsonl" > "$OUT/probes.log" 2>&1
    echo "probes exit $?; $(wc -l < "$OUT/probes.jsonl" 2>/dev/null || echo 0) records"
    tail -n 5 "$OUT/probes.log"
fi
