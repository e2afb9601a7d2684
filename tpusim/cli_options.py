"""Command-line options that the commands of every layer share, each defined once.

``tpusim``'s subcommands (:mod:`tpusim.app.cli`), the kernel's tools (``python -m
megakernel.commands.decode_check`` and its siblings) and the benchmarks all take a model, a chip, a
batch, a context and a schedule. Each option's name, value type and help text live here; a
command states only what is its own (the default, whether the option is required, and a help
text where the option means something narrower there, such as the KV cache length a kernel is
built for). The ``argparse`` types of numbers (:func:`whole_number`, :data:`positive_int`, ...)
live here too, so a count is refused in the same words by every command.

This module sits at the bottom of ``tpusim`` (it imports only ``hwmodels``), so ``megakernel``
and ``calibration`` can use it without importing the application layer.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from hwmodels import values
from hwmodels.errors import InputError

# --------------------------------------------------------------------------- value types


def argument_type(name: str, check: Callable[[str], Any]) -> Callable[[str], Any]:
    """An ``argparse`` type running ``check`` (a :mod:`hwmodels.values` rule): its InputError
    becomes argparse's one-line error (``tpusim CMD: error: argument --flag: ...``), exit 2."""
    def parse(text: str) -> Any:
        try:
            return check(text)
        except InputError as error:  # "value 0: must be >= 1" -> "must be >= 1, got 0"
            given, _, reason = str(error).removeprefix("value ").partition(": ")
            raise argparse.ArgumentTypeError(f"{reason}, got {given}") from None
    parse.__name__ = name  # argparse names the type in its "invalid NAME value" messages
    return parse


def whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An ``argparse`` type: a whole number in ``[minimum, maximum]`` (:func:`hwmodels.values.number`)."""
    return argument_type("whole number", lambda text: values.number(text, "value", kind=int, minimum=minimum,
                                                                    maximum=maximum))


def finite_number(minimum: float | None = None, maximum: float | None = None, *,
                  exclusive_minimum: bool = False) -> Callable[[str], float]:
    """An ``argparse`` type: a finite number in the range (no ``nan``, no ``inf``)."""
    return argument_type("number", lambda text: values.number(text, "value", minimum=minimum, maximum=maximum,
                                                              exclusive_minimum=exclusive_minimum))


positive_int = whole_number(1)  # counts, sizes, budgets, evaluation limits
nonnegative_int = whole_number(0)  # counts where 0 means off
seed_value = whole_number(0, values.SEED_MAX)  # routing draws, sampled candidates, arrivals

# --------------------------------------------------------------------------- shared options

MODEL_HELP = "model name (kimi-k3, muse-spark@int4+bf16, ...) or a YAML/config.json path"
KERNEL_MODEL_HELP = "a K3-structured model (kimi-k3, kimi-k3-mini, ...)"  # what the megakernel runs
HARDWARE_HELP = "chip name from the catalog (tpu-v7, gb200, ...)"
CHIPS_HELP = "number of chips"
BATCH_HELP = "sequences decoded per step"
CONTEXT_HELP = "tokens already in each sequence's cache"
KERNEL_CONTEXT_HELP = "KV cache length the kernel is built for"
SCHEDULE_HELP = "a built-in schedule (naive, published, layer-double-buffer, k3-ring, ...) or a schedule JSON file"
ROUTING_HELP = "uniform | identical | zipf[:s] | trace:PATH"
SEED_HELP = "routing draw seed"


def add_model_option(parser: argparse.ArgumentParser, *, default: str | None = None, required: bool = False,
                     help: str = MODEL_HELP) -> None:
    """``--model NAME|PATH``: a catalog model (``name@variant`` too) or a model file."""
    parser.add_argument("--model", default=default, required=required, help=help)


def add_hardware_option(parser: argparse.ArgumentParser, *, default: str | None = None, required: bool = False,
                        help: str = HARDWARE_HELP) -> None:
    """``--hardware CHIP``: a chip of the catalog."""
    parser.add_argument("--hardware", default=default, required=required, help=help)


def add_chips_option(parser: argparse.ArgumentParser, *, default: int | None = None, required: bool = False,
                     help: str = CHIPS_HELP) -> None:
    """``--chips N``: how many chips the system has (a whole number >= 1)."""
    parser.add_argument("--chips", type=positive_int, default=default, required=required, help=help)


def add_batch_option(parser: argparse.ArgumentParser, *, default: Any = 1,
                     type: Callable[[str], Any] | None = positive_int, help: str = BATCH_HELP,
                     **extra: Any) -> None:
    """``--batch B``: sequences decoded per step (a whole number >= 1 unless ``type`` says
    otherwise: a list of sizes, or a tool's plain ``int``); ``extra`` goes to ``add_argument``."""
    parser.add_argument("--batch", type=type, default=default, help=help, **extra)


def add_context_option(parser: argparse.ArgumentParser, *, default: int = 1024,
                       type: Callable[[str], Any] = positive_int, help: str = CONTEXT_HELP) -> None:
    """``--context T``: tokens already in each sequence's KV cache (or, for a kernel built
    ahead, the cache length it is built for: :data:`KERNEL_CONTEXT_HELP`)."""
    parser.add_argument("--context", type=type, default=default, help=help)


def add_schedule_option(parser: argparse.ArgumentParser, *, default: str | None = None, required: bool = False,
                        help: str = SCHEDULE_HELP) -> None:
    """``--schedule NAME|FILE``: a built-in prefetch schedule or a schedule JSON file."""
    parser.add_argument("--schedule", default=default, required=required, help=help)


# what the committed joint sweeps searched a deployment for (docs/joint-sweep.md)
DEPLOYMENT_MODEL = "kimi-k3"
DEPLOYMENT_DEVICES = 32  # 16 two-core TPU v7 chips


def add_deployment_options(parser: argparse.ArgumentParser, *, searched_default: bool = True,
                           when: str = "") -> None:
    """``--deployment-model NAME`` and ``--deployment-devices N``: what a schedule's deployment
    (a joint sweep's best.json: plan and collective algorithms) was searched for, so a kernel tool
    can map it onto its own ``--model`` and ``--devices``. By default the joint sweep's
    (:data:`DEPLOYMENT_MODEL` on :data:`DEPLOYMENT_DEVICES`); with ``searched_default`` False, none
    (the tool's own model and devices). ``when`` starts each help text (``"with --devices: "``)."""
    if searched_default:
        model, devices = DEPLOYMENT_MODEL, DEPLOYMENT_DEVICES
        model_note, devices_note = f"default {model}", f"default {devices}: 16 two-core TPU v7 chips"
    else:
        model, devices, model_note, devices_note = None, None, "default: --model", "default: --devices"
    parser.add_argument("--deployment-model", default=model,
                        help=f"{when}the model the schedule's deployment was searched for ({model_note})")
    parser.add_argument("--deployment-devices", type=positive_int, default=devices,
                        help=f"{when}the devices it was searched on, when its plan does not name them ({devices_note})")


def add_routing_options(parser: argparse.ArgumentParser, *, routing_help: str = ROUTING_HELP,
                        seed_help: str = SEED_HELP) -> None:
    """``--routing MODEL`` (which experts a token picks) and ``--seed N`` (its draw)."""
    parser.add_argument("--routing", default="uniform", help=routing_help)
    parser.add_argument("--seed", type=seed_value, default=0, help=seed_help)
