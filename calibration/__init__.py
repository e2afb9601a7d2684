"""Calibration: measurements in, fitted hardware overlays and error reports out."""
