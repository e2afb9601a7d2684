"""The chip catalog: YAML files in, validated :class:`~hwmodels.schema.Chip` objects out.

Where entries live
------------------
Two folders, searched in this order (see :func:`catalog_dirs`):

1. **built-in** — ``hwmodels/catalog/*.yaml`` inside the package: published chips, one file
   per chip, every value with its source. These are read-only data; nothing in tpusim writes
   to them.
2. **local** — ``$TPUSIM_LOCAL_DIR`` if set, else the user's data directory
   (``~/.local/share/tpusim`` on Linux, via ``platformdirs``):
   machine-local entries such as the probed ``host-cpu.yaml`` (see :mod:`hwmodels.probe`),
   and ``calibrated/<chip>.yaml`` overlays written by calibration (see
   :mod:`hwmodels.overlay`).

A file's stem is the chip's name (``tpu-v7.yaml`` holds ``name: tpu-v7``). A local entry
may add a chip but never shadow a built-in one: that would silently override published data,
so it is an error.

Loading a chip
--------------
``load_chip("tpu-v7")`` reads the built-in file, validates it against the schema and, by
default, applies the calibrated overlay if one exists; ``calibrated=False`` (or
:func:`published_chip`) returns the published figures alone. Any problem with a file — YAML
syntax, a missing field, a negative bandwidth — becomes an :class:`~hwmodels.errors.InputError`
whose one-line message names the file and the field path::

    hwmodels/catalog/x.yaml: hbm.peak_bandwidth_bytes_per_s.value: Input should be greater than or equal to 0

List elements that carry a ``name`` are addressed by it (``links.ici.latency_s``), the same
dotted paths calibration overlays use.

Systems
-------
``make_system("tpu-v7", 8)`` joins 8 chips (16 devices) and counts the hosts they hang off,
using :data:`CHIPS_PER_HOST`.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml
from pydantic import ValidationError

from hwmodels.errors import InputError
from hwmodels.files import (
    BUILTIN_DIR,
    display_path,
    format_validation_error,
    local_dir,
    read_yaml_mapping,
)
from hwmodels.overlay import apply_overlay, load_overlay, overlay_path
from hwmodels.schema import Chip, System

__all__ = ["BUILTIN_DIR", "display_path", "local_dir", "read_yaml_mapping"]

# Chips per host, by chip name; chips not listed fall back to their kind. TPU hosts drive 4
# chips (a v5e/v6e "-8" slice uses 8 on one host, but 4 per host is the pod building block);
# an HGX GPU server holds 8 GPUs; a GB200 NVL72 compute tray holds 2 Grace-Blackwell
# superchips = 4 GPUs; the probed host CPU is its own host.
CHIPS_PER_HOST: dict[str, int] = {"gb200": 4, "gb300": 4}
CHIPS_PER_HOST_BY_KIND: dict[str, int] = {"tpu": 4, "gpu": 8, "cpu": 1}



HOST_CHIP_NAME = "host-cpu"  # the probed host: written by `tpusim hardware probe` (hwmodels.probe)

def catalog_dirs() -> list[Path]:
    """Folders searched for ``<chip>.yaml``, built-in first, then the local folder."""
    return [BUILTIN_DIR, local_dir()]


def _chip_paths() -> dict[str, Path]:
    """Map chip name -> YAML file across the catalog folders; a name defined twice (a local
    entry shadowing a built-in one) is an error rather than a silent override."""
    paths: dict[str, Path] = {}
    for folder in catalog_dirs():
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.yaml")):
            name = path.stem
            if name in paths:
                raise InputError(
                    f"{display_path(path)}: chip {name!r} is already defined by "
                    f"{display_path(paths[name])}; local entries may not shadow built-in ones"
                )
            paths[name] = path
    return paths


def list_chips() -> list[str]:
    """Names of every chip in the catalog (built-in and local), sorted."""
    return sorted(_chip_paths())


def load_chip_file(path: Path | str) -> Chip:
    """Read and validate one chip YAML file (no overlay applied)."""
    data = read_yaml_mapping(path)
    try:
        return Chip.model_validate(data)
    except ValidationError as error:
        raise InputError(format_validation_error(display_path(path), error, data)) from None


def load_chip(name: str, *, calibrated: bool = True) -> Chip:
    """The catalog chip ``name``; with ``calibrated`` its overlay (if any) is applied on top.

    The file's ``name`` field must equal its stem. Unknown names raise an InputError that
    lists the available chips.
    """
    paths = _chip_paths()
    if name not in paths:
        if name == HOST_CHIP_NAME:  # written by the probe, into the local folder
            raise InputError(f"{name} has not been measured on this machine yet (no {name}.yaml in "
                             f"{display_path(local_dir())}): run `tpusim hardware probe` first")
        available = ", ".join(sorted(paths)) or "(none)"
        raise InputError(f"unknown chip {name!r}; available: {available}")
    chip = load_chip_file(paths[name])
    if chip.name != name:
        raise InputError(
            f"{display_path(paths[name])}: name: {chip.name!r} does not match the file name "
            f"{name!r}"
        )
    if not calibrated:
        return chip
    path = overlay_path(name)
    if not path.is_file():
        return _derived_stack_figures(chip)
    return apply_overlay(chip, load_overlay(path), origin=display_path(path))


DERIVED_PATHS = ("execution.gpu.", "execution.per_op_efficiency")  # per-kernel figures of the SM architecture


def _derived_stack_figures(chip: Chip) -> Chip:
    """``chip`` with the per-kernel execution figures another chip's overlay calibrated
    (``execution.gpu.stack_figures_from``), each labelled *derived from calibrated <chip>*;
    bandwidths, links and counts stay this chip's own. Unchanged when there is no such overlay."""
    gpu = chip.execution.gpu
    source = gpu.stack_figures_from if gpu is not None else None
    if not source or source == chip.name or not overlay_path(source).is_file():
        return chip
    overlay = load_overlay(overlay_path(source))
    data = chip.model_dump(mode="json")
    for path, value in overlay.parameters.items():
        if not path.startswith(DERIVED_PATHS):
            continue
        node = data
        *parents, leaf = path.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = {"value": value.value, "label": "derived",
                      "source": f"derived from calibrated {source}: {value.value:.4g}, fitted on {value.fitted_on or overlay.fitted_on} "
                                f"(same SM architecture; this chip's own bandwidths, links and GPU count apply)"}
    return Chip.model_validate(data)


def published_chip(name: str) -> Chip:
    """The chip exactly as its catalog file states it, without any calibration overlay."""
    return load_chip(name, calibrated=False)


def chips_per_host(chip: Chip) -> int:
    """How many chips one host drives (see :data:`CHIPS_PER_HOST`)."""
    return CHIPS_PER_HOST.get(chip.name, CHIPS_PER_HOST_BY_KIND[chip.kind])


def make_system(chip_name: str, chips: int, *, calibrated: bool = True) -> System:
    """``chips`` copies of catalog chip ``chip_name``, on ``ceil(chips / chips_per_host)``
    hosts. A system larger than the chip's link domain (e.g. 9 H100s over an 8-GPU NVLink
    domain) is allowed; the simulator decides what crossing the domain costs."""
    if chips < 1:
        raise InputError(f"chips: must be >= 1 (got {chips})")
    chip = load_chip(chip_name, calibrated=calibrated)
    hosts = math.ceil(chips / chips_per_host(chip))
    return System(chip=chip, chips=chips, hosts=hosts)


# --------------------------------------------------------------------------- writing files


def chip_to_yaml(chip: Chip, header: str = "") -> str:
    """Serialise a chip as catalog YAML (``header`` lines become ``#`` comments)."""
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    body = yaml.safe_dump(
        chip.model_dump(mode="json", exclude_none=True, exclude={"calibration"}),
        sort_keys=False,
        allow_unicode=True,
        width=100,
    )
    return comment + body
