"""Default sizes of a sweep, tuned so K3 on tpu-v7 x16 fits the 120 s benchmark on 2 cores.

Measured on the 2-core dev machine (CPU time per evaluation, K3 batch 1 / 8): an estimate
10 / 14 ms, a 12-layer screen ~20 / 40 ms, a full engine step 0.06 / 0.15 s. The default
sweep (~1650 candidates: ~1500 estimated, ~510 screened, 64 simulated) takes 29 s / 44 s
wall with ``--jobs 2`` on a quiet machine and up to 62 s / 80 s while other jobs load both
cores (``benchmarks/bench_sweep.py`` prints the breakdown per phase).
"""

DEFAULT_BUDGET = 64  # full-step engine simulations, built-ins included
DEFAULT_SCREEN_FACTOR = 8  # screen the best screen_factor x budget candidates by estimate
DEFAULT_SCREEN_LAYERS = 12  # layers of the screening program (K3: dense layer 0, KDA and MLA)
DEFAULT_REFINE_SHARE = 0.25  # share of the budget for the refine round (budgets >= 8)
REFINE_FROM = 2  # the refine round explores the one-knob neighbours of this many best schedules
ESTIMATE_CHUNK = 25  # schedules per estimate task sent to a worker
