"""The one rule for a least-squares fit's uncertainty, identifiability, and correlated draws.

The solver (:func:`calibration.core.solver.solve`) states every fit's uncertainty with the
functions here, in its scaled variables ``x``; the prediction intervals
(:mod:`calibration.core.samples`) draw parameter sets with :func:`correlated_draws`. A source
that asks for no uncertainty (the GPU stack fits: three figures on four stage shares, two on
two step times) gets none, and its interval is the model error alone.

The rule, for residuals ``r`` (``n`` of them) and Jacobian ``J = ∂r/∂x`` (``n × p``) at
the solution:

1. **Jacobian** (:func:`central_jacobian`): central differences of relative size ``step``
   (2 % by default: a discrete-event simulator is piecewise smooth, and a wider step
   averages over event-order kinks), each side clipped to the bounds; a parameter pinned
   between equal bounds gets a zero column. (A source whose model is analytic and cheap,
   the GPU micro fit, asks for the solver's own Jacobian instead.)
2. **Inverse**: ``(JᵀJ)⁺``, the Moore–Penrose pseudo-inverse (numpy's ``pinv``, singular
   values below ``1e-15 ×`` the largest dropped). A rank-deficient or ill-conditioned ``J``
   therefore gives its flat directions a small, finite, *meaningless* variance, never an
   infinite one; such parameters are flagged (``flat``: :func:`unseen`,
   singular values below ``1e-8 ×`` the largest) and every procedure reports them as having
   no uncertainty.
3. **Residual variance** ``s² = rᵀr / (n − p)``, undefined when ``n ≤ p``.
4. **Covariance** ``cov(x) = (JᵀJ)⁺ · v``, where the variance factor ``v`` is
   - ``s²`` when the residuals are plain relative errors (no stated measurement σ: the
     scatter of the residuals is the only estimate of it); undefined (NaN) when ``n ≤ p``;
   - ``max(1, s²)`` when the residuals are already divided by a stated measurement σ
     (``stated_sigma=True``): the stated σ, inflated when the residuals say the model does
     worse than that; ``1`` when ``n ≤ p``.
   ``σ(x_j) = √cov_jj`` (negative round-off clipped to 0), and ``cov(θ) = cov(x) ⊙ θ_ref θ_refᵀ``.
5. **Leverage** ``h_ii = J_i (JᵀJ)⁺ J_iᵀ`` (the hat matrix's diagonal), for leave-one-out
   errors ``r_i / (1 − h_ii)``.

Draws (:func:`correlated_draws`) from ``N(θ, cov(θ))`` are taken as ``θ + sd · z`` with
``z ~ N(0, correlation)``: a covariance of figures near ``1e12`` (bandwidths) has round-off
far above numpy's absolute PSD tolerance, a correlation matrix not; a correlation made
slightly indefinite by round-off is replaced by its nearest PSD matrix (:func:`nearest_psd`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

JACOBIAN_STEP = 0.02  # relative central-difference step of the uncertainty Jacobian


def central_jacobian(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray, lower: np.ndarray,
                     upper: np.ndarray, step: float = JACOBIAN_STEP, *, absolute: bool = False) -> np.ndarray:
    """``∂fn/∂x`` (``n × p``) by central differences of relative size ``step`` (``absolute``: of
    size ``step``, for ``x = ln θ``, where it is the same relative change of θ), clipped to the bounds."""
    columns = []
    for j in range(len(x)):
        h = step if absolute else step * max(abs(float(x[j])), 1e-3)
        plus, minus = x.copy(), x.copy()
        plus[j], minus[j] = min(x[j] + h, upper[j]), max(x[j] - h, lower[j])
        width = plus[j] - minus[j]
        columns.append((fn(plus) - fn(minus)) / width if width > 0 else np.zeros_like(fn(x)))
    return np.stack(columns, axis=1)


@dataclass(frozen=True)
class FitCovariance:
    """Step 2–5 of the module rule, in the solver's scaled variables ``x``."""

    jtj_inv: np.ndarray  # (JᵀJ)⁺, p × p
    s2: float | None  # residual variance rᵀr / (n − p); None when n ≤ p
    cov: np.ndarray  # (JᵀJ)⁺ · variance factor, p × p (NaN when the factor is undefined)
    hat: np.ndarray  # leverage h_ii per residual
    flat: np.ndarray  # bool per parameter: in a direction the data cannot see

    @property
    def sigma(self) -> np.ndarray:
        """``√cov_jj`` per parameter (negative round-off clipped to 0)."""
        return np.sqrt(np.clip(np.diag(self.cov), 0.0, None))

    def scaled(self, ref: np.ndarray) -> np.ndarray:
        """The covariance of ``θ = x · ref`` (in the parameters' own units)."""
        return self.cov * np.outer(ref, ref)


def fit_covariance(jac: np.ndarray, residuals: np.ndarray, *, stated_sigma: bool = False) -> FitCovariance:
    """The module rule for ``J`` and ``r`` at a least-squares solution; ``stated_sigma``: the
    residuals are already divided by a stated measurement σ (variance factor ``max(1, s²)``)."""
    n, p = jac.shape
    jtj_inv = np.linalg.pinv(jac.T @ jac)
    s2 = float(residuals @ residuals / (n - p)) if n > p else None
    if stated_sigma:
        factor = max(1.0, s2) if s2 is not None else 1.0
    else:
        factor = s2 if s2 is not None else float("nan")
    hat = np.einsum("ij,jk,ik->i", jac, jtj_inv, jac)
    return FitCovariance(jtj_inv=jtj_inv, s2=s2, cov=jtj_inv * factor, hat=hat, flat=unseen(jac))


def nearest_psd(cov: np.ndarray) -> np.ndarray:
    """The covariance made symmetric with negative eigenvalues set to 0 (a fit's covariance of
    a weakly pinned parameter can come out slightly indefinite from round-off; numpy would
    otherwise draw with the eigenvalues' absolute values)."""
    sym = (cov + cov.T) / 2
    eigenvalues, vectors = np.linalg.eigh(sym)
    if eigenvalues.min(initial=0.0) >= 0:
        return sym
    return (vectors * np.clip(eigenvalues, 0.0, None)) @ vectors.T


def correlated_draws(rng: np.random.Generator, mean: np.ndarray, cov: np.ndarray, n: int) -> np.ndarray:
    """``n × p`` draws from ``N(mean, cov)``, taken as ``mean + sd · z``, ``z ~ N(0, correlation)``
    (see the module docstring); a parameter with zero variance stays at its mean."""
    mean = np.asarray(mean, dtype=float)
    cov = np.asarray(cov, dtype=float)
    sd = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    scale = np.where(sd > 0, sd, 1.0)
    correlation = nearest_psd(cov / np.outer(scale, scale))
    return mean + scale * rng.multivariate_normal(np.zeros(mean.size), correlation, size=n, method="eigh")


@dataclass(frozen=True)
class Identifiability:
    """How well the data pins each parameter: singular values and the weakest direction."""

    singular_values: tuple[float, ...]
    condition: float
    weakest: dict[str, float]  # parameter -> component of the weakest singular vector

    def summary(self) -> str:
        worst = max(self.weakest, key=lambda key: abs(self.weakest[key]))
        return f"condition number {self.condition:.3g}; weakest direction mostly {worst}"


def identifiability(jacobian: np.ndarray, paths: list[str]) -> Identifiability:
    """Singular values of the (scaled) Jacobian: a tiny one means a combination of
    parameters the data cannot see; its singular vector names the parameters involved."""
    _, singular, vt = np.linalg.svd(jacobian, full_matrices=False)
    condition = float(singular[0] / singular[-1]) if singular[-1] > 0 else float("inf")
    return Identifiability(
        singular_values=tuple(float(s) for s in singular),
        condition=condition,
        weakest={path: float(c) for path, c in zip(paths, vt[-1], strict=True)},
    )


RANK_TOLERANCE = 1e-8  # singular values below this fraction of the largest count as zero


def unseen(jacobian: np.ndarray) -> np.ndarray:
    """Boolean per parameter: part of a combination the data cannot see at all (a singular
    value below :data:`RANK_TOLERANCE` of the largest, and a component above 0.1 in its
    singular vector). A pseudo-inverse would give such parameters a small, meaningless
    variance; they are reported unidentifiable instead."""
    flagged = np.zeros(jacobian.shape[1], dtype=bool)
    if not jacobian.size:
        return flagged
    _, singular, vt = np.linalg.svd(jacobian, full_matrices=True)
    largest = singular[0] if singular.size and singular[0] > 0 else 1.0
    padded = np.zeros(vt.shape[0])
    padded[:singular.size] = singular
    for k in np.flatnonzero(padded < RANK_TOLERANCE * largest):
        flagged |= np.abs(vt[k]) > 0.1
    return flagged
