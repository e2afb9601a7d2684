"""The unit hint of a refused calibration points the right way (records hold milliseconds)."""

from __future__ import annotations

from calibration.reports.trust import unit_problem


def test_values_in_seconds_are_called_seconds() -> None:
    """The issue's case: step times written in seconds (0.005 for 5 ms) were hinted as 'ms given as µs?'."""
    refusal = unit_problem([0.005, 0.006], [5.0, 6.0])  # measured 1000x below the prediction
    assert refusal is not None and "seconds given as ms?" in refusal.reason


def test_values_in_microseconds_are_called_microseconds() -> None:
    refusal = unit_problem([5000.0, 6000.0], [5.0, 6.0])
    assert refusal is not None and "µs given as ms?" in refusal.reason


def test_right_units_pass() -> None:
    assert unit_problem([5.1, 6.2], [5.0, 6.0]) is None
