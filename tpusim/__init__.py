"""tpusim: workloads, prefetch schedules, a SimPy engine and analytic floors for MoE decode."""

__version__ = "0.1.0"
