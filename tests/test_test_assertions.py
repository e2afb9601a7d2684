"""No test whose only checks are weak (issue 47): a test function whose every ``assert`` says only
that a value exists or is positive proves little, since a wrong value passes as well as the right
one. Read from the source with ``ast``, as tests/test_fitting_rules.py reads the fitting rules.

A check is **weak** when its expression is one of

- ``x is not None``;
- ``x > 0``, ``x >= 0``, ``x != 0`` or ``x >= 1`` (and ``0 < x`` ...): positive, non-negative,
  non-empty (``len(x) > 0``);
- bare truthiness of a value: ``x``, ``x.attr``, ``x[key]`` or a call ``f(x)`` that is not a
  predicate (a predicate answers a question: ``isinstance``, ``all``, ``any``, ``callable``,
  ``is_*``/``has_*``, ``startswith``, ``exists``, ``match`` ...; its truth is its answer);
- an ``and`` of weak checks.

A test is an **offender** when it asserts something and every assert is weak, and it makes no
other check (``pytest.raises``/``warns``/``approx`` or an ``assert_*`` helper such as
``np.testing.assert_array_equal``). The fix is an independent expectation of the value, not a
copy of what the code printed.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PREDICATE_PREFIXES = ("is_", "has_", "can_", "needs_", "should_", "isclose", "allclose", "array_equal")
PREDICATES = {"isinstance", "issubclass", "callable", "all", "any", "bool", "exists", "is_file", "is_dir",
              "startswith", "endswith", "match", "search", "fullmatch", "isdigit", "isidentifier", "mentions",
              "S_ISFIFO", "S_ISREG", "S_ISDIR", "issubset", "issuperset", "isdisjoint", "equals"}
OTHER_CHECKS = ("raises", "warns", "approx", "deprecated_call")


def _call_name(node: ast.Call) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def _is_zero_or_one(node: ast.expr, values: tuple[int, ...]) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value in values


def is_weak(test: ast.expr) -> bool:
    """Whether an assert's expression is a weak check (module docstring)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return all(is_weak(value) for value in test.values)
    if isinstance(test, ast.Compare):
        if len(test.ops) != 1:
            return False  # a range, 0 < x < 1: a bound on both sides
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(op, ast.IsNot):
            return isinstance(right, ast.Constant) and right.value is None
        if isinstance(op, ast.Gt | ast.NotEq) and _is_zero_or_one(right, (0,)):
            return True
        if isinstance(op, ast.GtE) and _is_zero_or_one(right, (0, 1)):
            return True
        if isinstance(op, ast.Lt | ast.NotEq) and _is_zero_or_one(left, (0,)):
            return True
        return isinstance(op, ast.LtE) and _is_zero_or_one(left, (0, 1))
    if isinstance(test, ast.Name | ast.Attribute | ast.Subscript):
        return True
    if isinstance(test, ast.Call):
        name = _call_name(test)
        return name not in PREDICATES and not name.startswith(PREDICATE_PREFIXES)
    return False


def _makes_other_checks(function: ast.FunctionDef) -> bool:
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name in OTHER_CHECKS or name.startswith("assert"):
                return True
    return False


def weak_tests(text: str, where: str) -> list[str]:
    """``where:line name`` of every offending test function of ``text`` (module docstring)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            asserts = [n.test for n in ast.walk(node) if isinstance(n, ast.Assert)]
            if asserts and all(map(is_weak, asserts)) and not _makes_other_checks(node):
                found.append(f"{where}:{node.lineno} {node.name}")
    return found


def test_no_test_checks_only_that_a_value_exists_or_is_positive() -> None:
    offenders = [found for path in sorted(TESTS.glob("*.py"))
                 for found in weak_tests(path.read_text(encoding="utf-8"), path.name)]
    assert offenders == []


PLANTED = '''
def test_positive(result):
    assert result.step_s > 0
    assert len(result.ops) > 0

def test_exists(report):
    assert report is not None and report["rows"]

def test_truthy_call(run):
    assert run()

def test_nonnegative_mirrored(x):
    assert 0 <= x.seconds

def test_an_expected_value(result):
    assert result.step_s > 0
    assert result.step_s == 1.5e-3

def test_a_range(x):
    assert 0 < x < 1

def test_emptiness(races):
    assert not races

def test_a_predicate(path):
    assert path.is_file() and isinstance(path, object)

def test_a_refusal(run):
    with pytest.raises(ValueError):
        run()
    assert run is not None

def test_a_helper_check(a, b):
    np.testing.assert_array_equal(a, b)
    assert a is not None

def helper_not_a_test(x):
    assert x > 0

def test_nothing_asserted(x):
    x.run()
'''


def test_the_checker_finds_the_planted_weak_tests_and_only_them() -> None:
    assert weak_tests(PLANTED, "planted.py") == ["planted.py:2 test_positive", "planted.py:6 test_exists",
                                                 "planted.py:9 test_truthy_call",
                                                 "planted.py:12 test_nonnegative_mirrored"]
