"""One rule for "within rounding" between the kernel and a reference: the tolerances live in
:mod:`megakernel.tolerance` (one table, by comparison and dtype; the multi-device check
reports against the same numbers); this helper turns them into test assertions."""

from __future__ import annotations

import jax
import numpy as np

from megakernel.tolerance import INDEPENDENT, TOLERANCE, TOLERANCES, relative_error

__all__ = ["TOLERANCE", "assert_within_rounding"]


def assert_within_rounding(got: jax.Array, want: jax.Array, what: str, *, comparison: str = INDEPENDENT) -> None:
    """Fail when ``got`` is further from ``want`` than the tolerance of ``comparison`` (a row
    of :data:`megakernel.tolerance.TOLERANCES`) for ``want``'s dtype allows."""
    tol = TOLERANCES[comparison][np.dtype(want.dtype)]
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got64.shape == want64.shape, f"{what}: shape {got64.shape} != {want64.shape}"
    err = relative_error(got64, want64)
    assert err <= tol, f"{what}: max relative error {err:.3g} > {tol}"
