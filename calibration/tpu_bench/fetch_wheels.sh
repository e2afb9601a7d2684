#!/usr/bin/env bash
# Fill .whl-tpu (ignored via .git/info/exclude) with the pure-Python wheels the lent TPU v5e
# lacks, at the versions installed in this checkout's .venv, for run_on_device.sh to install
# offline there. The machine has JAX, libtpu, numpy and scipy; everything else travels.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl-tpu/' .git/info/exclude 2>/dev/null || echo /.whl-tpu/ >> .git/info/exclude
PY=.venv/bin/python
for name in pydantic pydantic_core annotated_types typing_inspection typing_extensions simpy \
        PyYAML platformdirs rich markdown_it_py mdurl pygments; do
    version=$($PY -c "import importlib.metadata as m; print(m.version('$name'))")
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl-tpu "$name==$version"
done
ls .whl-tpu
