"""The application layer: the command line, the demo and its report. Nothing below imports it."""
