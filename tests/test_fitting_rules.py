"""One home for the direct fitting rules (issue 47): a straight line (``polyfit``) and a median
are taken only in :mod:`calibration.core.fitting`; every source and report calls it. Read from
the source with ``ast``, as tests/test_single_source.py reads the JSONL writer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from calibration.core.fitting import fit_line, fit_through_origin, median

ROOT = Path(__file__).resolve().parents[1]
OWNER = "calibration/core/fitting.py"
LINE_NAMES = {"polyfit", "Polynomial", "linregress", "lstsq"}  # a line fitted by hand
MEDIAN_NAMES = {"median", "nanmedian", "median_low", "median_high"}


def _rules_in(text: str, where: str, names: set[str]) -> list[str]:
    """``where:line`` of every ``module.NAME(...)`` call in ``text`` (``np.polyfit``,
    ``statistics.median``) and every ``from ... import NAME`` not from the owner."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names:
            found.append(f"{where}:{node.lineno} {ast.unparse(node.func)}")
        if isinstance(node, ast.ImportFrom) and node.module != "calibration.core.fitting" \
                and any(alias.name in names for alias in node.names):
            found.append(f"{where}:{node.lineno} from {node.module}")
    return found


def _attribute_calls(folders: tuple[str, ...], names: set[str]) -> list[str]:
    """:func:`_rules_in` over every module of ``folders`` but the owner."""
    return [hit for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))
            if str(path.relative_to(ROOT)) != OWNER
            for hit in _rules_in(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)), names)]


def test_no_line_is_fitted_outside_the_core() -> None:
    assert _attribute_calls(("hwmodels", "tpusim", "megakernel", "calibration", "benchmarks"), LINE_NAMES) == []


def test_no_median_rule_outside_the_core() -> None:
    """Inside calibration every median (a figure's rule or a record's summary) is the core's."""
    assert _attribute_calls(("calibration",), MEDIAN_NAMES) == []


def test_the_scan_sees_a_planted_rule() -> None:
    planted = "import numpy as np\nfrom statistics import median\nslope = np.polyfit(x, y, 1)[0]\nm = np.median(v)\n"
    assert sorted(_rules_in(planted, "planted.py", LINE_NAMES | MEDIAN_NAMES)) == [
        "planted.py:2 from statistics", "planted.py:3 np.polyfit", "planted.py:4 np.median"]


def test_the_line_and_the_median() -> None:
    line = fit_line([0.0, 1.0, 2.0], [1.0, 3.0, 5.0])
    assert (line.slope, line.intercept, line.slope_standard_error) == pytest.approx((2.0, 1.0, None))
    noisy = fit_line([0, 1, 2, 3], [0.0, 1.1, 1.9, 3.0], standard_error=True)
    assert noisy.slope == pytest.approx(0.98) and 0.0 < noisy.slope_standard_error < 0.1
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 2.0, 3.0]) == 2.5


def test_the_fit_through_the_origin() -> None:
    # y = 2 a + 0.5 b exactly at three points; a fourth off by +1 moves both a little
    assert fit_through_origin([[1, 0, 2], [0, 4, 2]], [2.0, 2.0, 5.0]) == pytest.approx((2.0, 0.5))
    with pytest.raises(ValueError, match="cannot fix"):
        fit_through_origin([[1, 2], [2, 4]], [1.0, 2.0])  # dependent columns


def test_rank_agreement_counts_a_float_noise_difference_as_a_tie() -> None:
    """Set v5e-aq's batch-8 decodes: ``published`` and ``published-after-routing`` simulate
    1e-11 ms apart, their order flipping with the last bit of an input; at 1 µs they tie."""
    from scipy.stats import kendalltau

    from calibration.core.fitting import rank_agreement

    measured = [73.44, 73.38, 75.70, 76.41]
    one_way = [74.954305790691, 74.95430579069102, 76.10, 76.37]
    other_way = [74.84841749898262, 74.84841749898231, 75.99, 76.26]
    assert kendalltau(measured, one_way).statistic != kendalltau(measured, other_way).statistic
    assert rank_agreement(measured, one_way) == rank_agreement(measured, other_way)
    assert rank_agreement(measured, [1.0, 2.0, 3.0, 4.0]) == kendalltau(measured, [1.0, 2.0, 3.0, 4.0]).statistic
