"""Binary byte units, defined once for every layer (``MIB = 1 << 20``, never ``1024 * 1024``).

Plain integers with no imports, so the device harnesses can read them without pydantic.
``calibration.gpu_bench.micro`` keeps a mirror (that harness imports nothing of the house;
``tests/test_single_source.py`` checks the two agree).
"""

from __future__ import annotations

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
