"""Every flag changes the answer or is refused: the per-command table of flags a path ignores.

A command's chosen path (decode or prefill, a megakernel chip or a GPU serving stack, plain
or speculative decoding, a sweep or a fixed schedule) uses some flags and not others. A
flag the user *typed* (``args.given``, filled by :func:`tpusim.app.cli.given_options`) that
the chosen path does not use is an input error, one line naming the flag and why, exit 2;
it is never silently dropped while the output carries its name.

Each rule is ``(dest, why)``: ``why(args, context)`` returns the reason the flag is unused
on this path, or ``None`` when it is used. ``context`` holds what the command resolved
before checking (the chip, the systems). :data:`RULES` is the table of ``tpusim``'s own
commands; a command of a layer above declares its rules beside its flags, with
``parser.set_defaults(flag_rules=((dest, why), ...))`` (``demo``, ``calibrate``), and
:func:`every_rule` joins the two; ``tests/test_flag_rules.py`` walks it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from hwmodels.errors import InputError

Why = Callable[[argparse.Namespace, Mapping[str, Any]], str | None]


def _decode(args: argparse.Namespace, _: Mapping[str, Any]) -> str | None:
    if getattr(args, "phase", "decode") == "decode":
        return "used only with --phase prefill (a decode step takes --batch and --context)"
    return None


def _prefill(args: argparse.Namespace, _: Mapping[str, Any]) -> str | None:
    if getattr(args, "phase", "decode") == "prefill":
        return ("not used with --phase prefill (one sequence's chunk: --tokens prompt tokens after "
                "--prefix-tokens cached ones)")
    return None


def _no_schedule(args: argparse.Namespace, context: Mapping[str, Any]) -> str | None:
    chip = context.get("chip")
    if chip is not None and chip.execution.mode != "megakernel":
        return (f"{chip.name} runs {_mode_words(chip)}, which has no prefetch schedule; drop --schedule "
                f"(tpusim compare --systems {chip.name}:N:megakernel simulates a GPU megakernel)")
    return None


def _mode_words(chip: Any) -> str:
    from tpusim.compare.rows import execution_label

    return execution_label(chip)


def _needs(flag: str, dest: str) -> Why:
    def why(args: argparse.Namespace, _: Mapping[str, Any]) -> str | None:
        if dest not in args.given:
            return f"used only with {flag}"
        return None
    return why


def _compare_schedule(args: argparse.Namespace, context: Mapping[str, Any]) -> str | None:
    chips = context.get("chips", ())
    if chips and not any(chip.execution.mode == "megakernel" for chip in chips):
        return ("no system in --systems runs a megakernel (GPU serving stacks and eager launches have no "
                "prefetch schedule); add a TPU or a :megakernel system, or drop --schedule")
    return None


def _no_sweep(args: argparse.Namespace, context: Mapping[str, Any]) -> str | None:
    schedule = getattr(args, "schedule", None)
    if schedule not in (None, "best"):
        return f"used only by the sweep that picks each row's schedule; --schedule {schedule} runs no sweep"
    if _compare_schedule(args, context):
        return "no row runs a sweep (no megakernel system in --systems)"
    return None


def _no_speculation_compare(args: argparse.Namespace, _: Mapping[str, Any]) -> str | None:
    if not getattr(args, "spec_acceptance", ""):
        return "used only for speculative rows (--spec-acceptance)"
    return None


def _no_speculation_serving(args: argparse.Namespace, _: Mapping[str, Any]) -> str | None:
    if getattr(args, "acceptance_length", 1.0) <= 1.0:
        return "used only with speculative decoding (--acceptance-length > 1)"
    return None


def _serving_lengths(args: argparse.Namespace, _: Mapping[str, Any]) -> str | None:
    if getattr(args, "trace", None) is not None:
        return "a --trace file gives every request's lengths and arrival; drop this flag"
    return None


def _serving_requests(args: argparse.Namespace, _: Mapping[str, Any]) -> str | None:
    if getattr(args, "trace", None) is not None:
        return "a --trace file fixes the requests; drop --requests"
    return None


def _joint_only(args: argparse.Namespace, _: Mapping[str, Any]) -> str | None:
    if getattr(args, "space", None) != "joint":
        return "used only with --space joint (the deployment search)"
    return None


def _schedule_space_only(args: argparse.Namespace, _: Mapping[str, Any]) -> str | None:
    if getattr(args, "space", None) == "joint":
        return ("not used with --space joint (the joint search draws its own candidates, simulates every one in "
                "full and runs no Mosaic check)")
    return None


def _dask_only(args: argparse.Namespace, context: Mapping[str, Any]) -> str | None:
    if getattr(args, "executor", "local") != "dask":
        return "used only with --executor dask (the local executor runs --jobs processes on this host)"
    return _joint_only(args, context)


def _local_cluster_only(args: argparse.Namespace, context: Mapping[str, Any]) -> str | None:
    if getattr(args, "scheduler", None):
        return "--scheduler names an existing Dask cluster, whose workers are its own; drop --workers"
    return _dask_only(args, context)


def _not_dask(args: argparse.Namespace, _: Mapping[str, Any]) -> str | None:
    if getattr(args, "executor", "local") == "dask":
        return "with --executor dask the Dask workers evaluate the candidates (--workers); drop --jobs"
    return None


def _one_batch(args: argparse.Namespace, _: Mapping[str, Any]) -> str | None:
    if getattr(args, "batches", None) is not None:
        return "--batches gives the batches (one sweep each); drop --batch"
    return None


def _device_count(args: argparse.Namespace, _: Mapping[str, Any]) -> str | None:
    if getattr(args, "hardware", None):
        return "--hardware and --chips give the device count; drop --devices"
    return None


def _chips_need_hardware(args: argparse.Namespace, _: Mapping[str, Any]) -> str | None:
    if not getattr(args, "hardware", None):
        return "counts chips of a --hardware; without one say --devices N (or tp=N in --plan)"
    return None


def _results_diff(args: argparse.Namespace, context: Mapping[str, Any]) -> str | None:
    if context.get("results"):
        return ("two simulate --json results are compared as stored: nothing is simulated, so no workload "
                "option applies")
    return None


def schedule_unused(chip: Any) -> str | None:
    """Why two prefetch schedules mean nothing on ``chip`` (a GPU serving stack or eager
    launches), or ``None`` on a megakernel chip (``diff``; ``simulate --schedule`` is a rule)."""
    if chip.execution.mode == "megakernel":
        return None
    return (f"{chip.name} runs {_mode_words(chip)}, which has no prefetch schedule, so both would give the same "
            f"step; diff schedules on a TPU or a GPU megakernel (tpusim compare --systems {chip.name}:N:megakernel)")


WORKLOAD = ("model", "hardware", "chips", "batch", "context", "routing", "seed", "uncalibrated", "plot", "plot_layers")

RULES: dict[str, tuple[tuple[str, Why], ...]] = {
    "sweep": (
        ("batches", _joint_only), ("executor", _joint_only), ("baseline", _joint_only),
        ("no_kernel_gate", _joint_only), ("scheduler", _dask_only), ("workers", _local_cluster_only),
        ("jobs", _not_dask), ("batch", _one_batch),
        ("samples", _schedule_space_only), ("screen_factor", _schedule_space_only),
        ("screen_layers", _schedule_space_only), ("compile_check", _schedule_space_only),
        ("weight_banks", _needs("--compile-check", "compile_check")),
    ),
    "plan": (("devices", _device_count), ("chips", _chips_need_hardware)),
    "diff": (*((dest, _results_diff) for dest in WORKLOAD), ("plot_layers", _needs("--plot", "plot"))),
    "simulate": (
        ("tokens", _decode), ("prefix_tokens", _decode),
        ("batch", _prefill), ("context", _prefill),
        ("schedule", _no_schedule),
        ("plot_layers", _needs("--plot", "plot")),
    ),
    "compare": (
        ("schedule", _compare_schedule),
        ("sweep_budget", _no_sweep), ("sweep_samples", _no_sweep), ("jobs", _no_sweep), ("out", _no_sweep),
        ("drafter", _no_speculation_compare), ("draft_tokens", _no_speculation_compare),
    ),
    "serving": (
        ("drafter", _no_speculation_serving), ("draft_tokens", _no_speculation_serving),
        ("input_tokens", _serving_lengths), ("output_tokens", _serving_lengths),
        ("random_range_ratio", _serving_lengths),
        ("requests", _serving_requests),
    ),
}


def flag_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def every_rule(parser: argparse.ArgumentParser) -> dict[str, tuple[tuple[str, Why], ...]]:
    """:data:`RULES` and the rules the commands of ``parser`` declare (``flag_rules``), per command."""
    table = dict(RULES)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                declared = child.get_default("flag_rules") or ()
                if declared:
                    table[name] = (*table.get(name, ()), *declared)
    return table


def refuse_unused(args: argparse.Namespace, **context: Any) -> None:
    """Raise InputError for the first typed flag of ``args.command`` that its path ignores."""
    given = getattr(args, "given", frozenset())
    for dest, why in (*RULES.get(args.command, ()), *(getattr(args, "flag_rules", None) or ())):
        if dest not in given:
            continue
        reason = why(args, context)
        if reason:
            raise InputError(f"{flag_name(dest)}: {reason}")
