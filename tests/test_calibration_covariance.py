"""The one covariance rule (calibration.core.covariance) against the formulas it replaced."""

from __future__ import annotations

import math

import numpy as np

from calibration.core.covariance import central_jacobian, correlated_draws, fit_covariance


def _problem(n: int = 7, p: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return rng.standard_normal((n, p)), rng.standard_normal(n) * 0.1


def test_plain_relative_residuals_use_s2_and_the_pseudo_inverse() -> None:
    jac, r = _problem()
    fit = fit_covariance(jac, r)
    jtj_inv = np.linalg.pinv(jac.T @ jac)
    s2 = float(r @ r / (7 - 3))
    assert fit.s2 == s2
    np.testing.assert_array_equal(fit.cov, jtj_inv * s2)
    np.testing.assert_array_equal(fit.hat, np.einsum("ij,jk,ik->i", jac, jtj_inv, jac))
    # the GPU micro fit's former per-parameter formula gives the same σ bit for bit
    assert [math.sqrt(max(jtj_inv[j, j] * s2, 0.0)) for j in range(3)] == fit.sigma.tolist()


def test_stated_sigma_residuals_use_at_least_the_stated_variance() -> None:
    jac, r = _problem()
    small = fit_covariance(jac, r, stated_sigma=True)  # s² < 1: the stated σ stands
    np.testing.assert_array_equal(small.cov, np.linalg.pinv(jac.T @ jac))
    large = fit_covariance(jac, r * 100, stated_sigma=True)  # s² > 1: inflated
    np.testing.assert_array_equal(large.cov, np.linalg.pinv(jac.T @ jac) * large.s2)


def test_too_few_residuals_leave_the_variance_undefined_or_the_stated_one() -> None:
    jac, r = _problem(n=3)
    assert fit_covariance(jac, r).s2 is None
    assert np.isnan(fit_covariance(jac, r).cov).all()
    np.testing.assert_array_equal(fit_covariance(jac, r, stated_sigma=True).cov, np.linalg.pinv(jac.T @ jac))


def test_a_flat_direction_is_flagged_not_given_infinite_variance() -> None:
    jac, r = _problem()
    jac[:, 2] = 0.0
    fit = fit_covariance(jac, r)
    assert fit.flat.tolist() == [False, False, True]
    assert np.isfinite(fit.cov).all()


def test_the_central_jacobian_of_a_linear_map_is_its_matrix() -> None:
    matrix = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.0]])
    jac = central_jacobian(lambda x: matrix @ x, np.array([1.0, 2.0]), np.zeros(2), np.full(2, 10.0))
    np.testing.assert_allclose(jac, matrix, rtol=1e-12)
    pinned = central_jacobian(lambda x: matrix @ x, np.array([1.0, 2.0]), np.array([0.0, 2.0]), np.array([10.0, 2.0]))
    assert pinned[:, 1].tolist() == [0.0, 0.0, 0.0]  # equal bounds: a zero column


def test_draws_scale_a_correlation_so_figures_near_1e12_draw_cleanly() -> None:
    sd = np.array([1e11, 2.0])
    cov = np.array([[1.0, 0.5], [0.5, 1.0]]) * np.outer(sd, sd)
    draws = correlated_draws(np.random.default_rng(0), np.array([1e12, 10.0]), cov, 20000)
    np.testing.assert_allclose(draws.std(axis=0), sd, rtol=0.03)
    assert abs(np.corrcoef(draws.T)[0, 1] - 0.5) < 0.03
