"""Calibration sources: one module per kind of measurement (see :mod:`calibration`).

A source reads its measurements, states what it fits as a :class:`calibration.core.Problem`
(parameters from the one table, a prediction ``(chip, points) -> values``, the measured
values, their groups, the transform) and calls :func:`calibration.core.fit`; its held-out
errors come from :func:`calibration.core.leave_one_group_out` on the same problem with the
same options. Adding a source (a new chip's kernel timings, say) is adding one module here.
"""
