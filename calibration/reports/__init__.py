"""What a calibration shows a reader: tables, plots, refusals and the parameter table."""
