"""Reports of one simulation: floor tables, Perfetto traces, timeline plots."""
