"""Fuzz the ``tpusim`` command line: every subcommand, valid and invalid flags, corrupt files.

Run::

    nice -n 10 .venv/bin/python benchmarks/fuzz_cli.py --minutes 10      # the long form
    .venv/bin/python benchmarks/fuzz_cli.py --minutes 1 --heavy           # + K3 simulations

Each case is an argument list drawn (hypothesis) from the values of each flag of one
subcommand, valid and invalid: unknown names, zero and negative numbers, sizes that would
exhaust memory, and files that are corrupt (truncated JSON lines, YAML with wrong types,
empty files, binary garbage, a schedule with every knob at its extreme). The case runs
in-process through :func:`tpusim.app.cli.main` and must

1. exit 0 or 2 (argparse's own errors are exit 2 too), never raise;
2. print no traceback;
3. leave no half-written file: no atomic-write temporaries, every JSON / JSON-lines output
   parses;
4. if it exits 0 for a model on a system, either fit HBM (checked independently with
   :func:`tpusim.workload.capacity.capacity_report`) or say ``does not fit``;
5. the semantic half: valid-looking inputs misapplied to the model they are used with
   (another model's published plan or a plan file with another head split, ``--formats``
   for a family the model lacks, a schedule whose count is a boolean, a ``config.json``
   whose layer count is text that is not a number) end in exit 2 or a labelled
   ``warning``, never a silent answer. Whether a case is misapplied is decided here
   (:func:`misapplication`, from the raw plan YAML and the model's shapes), not read from
   the output. A ``config.json`` whose numbers are written as text that parses exactly
   (``"48"``) is refused since issue 48 (a count is a JSON integer); a checkpoint folder as
   ``--model`` is valid and must run.

6. the classes of issue 36 (:func:`_issue36_cases`), each with its own oracle here:

   - **output paths**: ``--trace`` / ``--plot`` / ``--out`` naming a FIFO, a folder, a
     symlink to a file, a dangling symlink or a symlink to a FIFO: exit 0 or 2, and after
     the run the FIFO is still a FIFO, every link still a link, the folder a folder;
   - **ignored flags**: a flag the chosen path does not use (prefill flags on decode, decode
     flags on prefill, a schedule on a GPU serving stack, an execution a TPU does not have,
     drafter flags without speculation): :func:`ignored_flag` says so independently, and
     the case must exit 2 naming the flag; exit 0 is *silently accepted*;
   - **config self-consistency**: a ``config.json`` with drawn head counts, hidden size,
     experts and top-k: :func:`inconsistent_config` decides (hidden not a multiple of the
     heads without ``head_dim``, KV heads not dividing the heads, top-k over the experts);
     exit 0 for one is a *confident wrong answer*;
   - **same question**: ``simulate`` and ``compare --schedule S`` of the same model, system,
     batch and schedule must give the same step time (one answer per question); a
     difference is a *confident wrong answer*.

7. the classes of issue 48 (:func:`_issue48_cases`): per subcommand, every number a user
   types with a non-finite, negative, fractional, empty or huge value; lists with an empty
   item; ``key=value`` lists with a key twice; a flag that has no effect where it is given
   (executor options without Dask, ``--force`` on a model that fits, ``--quick`` with a
   budget, a schedule diff on a GPU stack, a local dir that is not a folder, an abbreviation);
   ``config.json`` fields of the wrong type or range, an unknown architecture. Each such case
   must exit 2 with one line; exit 0 is *accepted and ignored*; an answer after
   :data:`HANG_S` seconds is a *hang*.

Every run prints the number of cases tried and of failures. Coverage: ``hardware``, ``plan``,
``floor``, ``simulate``, ``sweep`` (tiny budgets), ``compare`` (given schedules; no nested
sweeps), ``report``, ``calibrate`` (its input validation and corrupt measurement files; a
real fit is minutes, tested elsewhere), ``run-kernel`` and ``demo`` (argument validation
only: each case always carries one invalid value, as the real runs take minutes). Without
``--heavy`` the models are the small ones and K3 only in cases refused before simulating.
The CI test (``tests/test_cli_fuzz.py``) runs this harness for a bounded number of cases.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tpusim.workload.registry.names import Family

BIG = str(10**12)
HANG_S = 60  # a case answering later than this counts as a hang (issue 48)


@dataclass
class Outcome:
    argv: list[str]
    code: int
    stdout: str
    stderr: str
    problems: list[str] = field(default_factory=list)


def write_corpus(folder: Path) -> dict[str, str]:
    """Corrupt and extreme input files; returns name -> path."""
    folder.mkdir(parents=True, exist_ok=True)
    good_line = json.dumps({"model": "kimi-k3", "system": {"chip": "tpu-v7", "chips": 16}, "batch": 1,
                            "ms_per_step_median": 1.0})
    extreme = {
        "name": "extreme", "max_dmas_in_flight": 256, "expert_issue": "speculative",
        "expert_speculation_ops": 10**6, "speculation_miss_rate": 1.0, "kv_tile_tokens": 10**9,
        "kv_buffers": 16,
        "families": {fam: {"prefetch_distance_ops": 4096, "chunk_bytes": 4096, "buffers": 64}
                     for fam in (Family.KDA_PROJ, Family.MLA_PROJ, Family.GQA_PROJ, Family.SMALL_PARAMS, Family.ROUTER, Family.LATENT_PROJ,
                                 Family.SHARED_EXPERT, Family.ROUTED_EXPERT, Family.DENSE_MLP, Family.LM_HEAD)},
    }
    minimal = {**extreme, "name": "minimal", "max_dmas_in_flight": 1, "expert_issue": "after_routing",
               "expert_speculation_ops": 0, "speculation_miss_rate": 0.0, "kv_tile_tokens": 8, "kv_buffers": 1,
               "families": {fam: {"prefetch_distance_ops": 0, "buffers": 1} for fam in extreme["families"]}}
    files: dict[str, bytes] = {
        "empty.yaml": b"",
        "empty.json": b"",
        "empty.jsonl": b"",
        "garbage.bin": bytes(range(256)) * 4,
        "garbage.yaml": b"\x00\xff\xfe\x80 : : [\n",
        "wrong-types.yaml": b"name: 7\nhidden_size: lots\nnum_layers: [1, 2]\nformats: 3\n",
        "list.yaml": b"- 1\n- 2\n",
        "truncated.jsonl": (good_line + "\n" + good_line[: len(good_line) // 2]).encode(),
        "wrong-types.jsonl": b'{"model": 3, "batch": "x"}\n',
        "truncated.json": b'{"name": "x", "families": {"kda_proj": {"buffers": ',
        "config-truncated.json": b'{"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_',
        "config-wrong.json": b'{"model_type": "deepseek_v3", "hidden_size": "wide", "num_hidden_layers": -1}',
        "schedule-extreme.json": json.dumps(extreme).encode(),
        "schedule-minimal.json": json.dumps(minimal).encode(),
        "schedule-wrong.json": b'{"name": "", "max_dmas_in_flight": 0, "families": {"nope": {}}}',
        "trace-bad.json": b'{"layers": [[[1, 1, 1]]]}',
        "space-bad.json": b'{"samples": -3, "knobs": "all"}',
    }
    repo = Path(__file__).resolve().parents[1]
    qwen = json.loads((repo / "tests" / "data" / "qwen3-30b-a3b" / "config.json").read_text())
    files["config-text-count.json"] = json.dumps({**qwen, "num_hidden_layers": "4x8"}).encode()
    files["config-text-number.json"] = json.dumps({**qwen, "num_hidden_layers": "48"}).encode()
    files["schedule-bool.json"] = json.dumps({"name": "bool", "families": {Family.ROUTED_EXPERT: {"buffers": True}}}).encode()
    muse = (repo / "tpusim" / "models" / "plan-muse-tp8.yaml").read_text()
    files["plan-other-heads.yaml"] = "".join(line for line in muse.splitlines(keepends=True)
                                             if not line.startswith("model:")).encode()
    (folder / "qwen3-30b-a3b").mkdir(exist_ok=True)
    (folder / "qwen3-30b-a3b" / "config.json").write_text(json.dumps(qwen))
    paths = {"checkpoint-folder": str(folder / "qwen3-30b-a3b")}
    for name, data in files.items():
        path = folder / name
        path.write_bytes(data)
        paths[name] = str(path)
    paths["missing"] = str(folder / "does-not-exist.yaml")
    paths["a-folder"] = str(folder)
    special = folder / "special"  # output paths that must never be destroyed (class "output paths")
    special.mkdir(exist_ok=True)
    fifo = special / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    (special / "target.json").write_text("{}")
    for name, points_at in (("link.json", "target.json"), ("dangling.json", "nowhere.json"), ("link-fifo", "fifo")):
        if not (special / name).is_symlink():
            (special / name).symlink_to(points_at)
    paths.update({f"special:{name}": str(special / name) for name in ("fifo", "link.json", "dangling.json",
                                                                      "link-fifo")})
    paths["special:folder"] = str(special)
    qwen_dense = json.loads((repo / "tests" / "data" / "qwen3-8b" / "config.json").read_text())
    paths["config-base"] = json.dumps(qwen_dense)  # the drawn configs start from this (not a path)
    return paths


def _opt(flag: str, values: list[str]) -> st.SearchStrategy[list[str]]:
    return st.one_of(st.just([]), st.sampled_from(values).map(lambda v: [flag, v]))


def _flags(*parts: st.SearchStrategy[list[str]]) -> st.SearchStrategy[list[str]]:
    return st.tuples(*parts).map(lambda groups: [token for group in groups for token in group])


def _file_command_cases(corpus: dict[str, str], out: st.SearchStrategy[str],
                        hardware: list[str]) -> tuple[st.SearchStrategy[list[str]], ...]:
    """``hardware``, ``report``, ``calibrate``, ``run-kernel`` and ``demo`` cases (the last three
    only as far as their input validation goes; their real runs take minutes)."""
    hardware_cmd = st.one_of(st.just(["hardware"]),
                             _flags(st.just(["hardware", "show"]), st.sampled_from(hardware[:-1]).map(lambda v: [v]),
                                    st.sampled_from([[], ["--json"], ["--uncalibrated"]])))
    measurements = [corpus["truncated.jsonl"], corpus["empty.jsonl"], corpus["wrong-types.jsonl"],
                    corpus["garbage.bin"], corpus["missing"], "published:nope", "published:tpu7x-musespark"]
    report = _flags(st.just(["report"]), st.sampled_from(hardware).map(lambda v: ["--hardware", v]),
                    st.sampled_from(measurements[:-1]).map(lambda v: ["--measurements", v]), st.just(["--json"]))
    calibrate = _flags(st.just(["calibrate"]), st.sampled_from(hardware).map(lambda v: ["--hardware", v]),
                       st.sampled_from(measurements[:-1]).map(lambda v: ["--measurements", v]),
                       _opt("--holdout", ["format=int4+bf16", "nonsense", "=", "batch=x"]),
                       _opt("--parameters", ["nope.figure", ""]), out.map(lambda o: ["--out", o]),
                       st.sampled_from([["--max-evals", "1"], ["--max-evals", "0"]]), st.just(["--json", "--no-probe"]))
    invalid_kernel = st.sampled_from([["--batch", "0"], ["--steps", "0"], ["--context", "-1"], ["--model", "nope"],
                                      ["--model", "kimi-k3"], ["--schedule", corpus["schedule-wrong.json"]],
                                      ["--backend", "tpu"], ["--backend", "gpu"], ["--batch", "x"]])
    run_kernel = _flags(st.just(["run-kernel", "--schedule", "published"]), invalid_kernel,
                        out.map(lambda o: ["--out", o + ".jsonl"]))
    invalid_demo = st.sampled_from([["--jobs", "0"], ["--jobs", "-1"], ["--sweep-budget", "0"], ["--jobs", "x"],
                                    ["--out", corpus["empty.json"]]])
    demo = _flags(st.just(["demo"]), invalid_demo, st.sampled_from([[], ["--quick"]]))
    return hardware_cmd, report, calibrate, run_kernel, demo


def cases(corpus: dict[str, str], out_root: Path, *, heavy: bool) -> st.SearchStrategy[list[str]]:
    """Argument lists for every subcommand (see the module docstring)."""
    small_models = ["kimi-k3-mini", "kimi-k3-draft"]
    models = [*small_models, "kimi-k3", "muse-spark", "nope", "kimi-k3@bogus", corpus["wrong-types.yaml"],
                             corpus["empty.yaml"], corpus["garbage.yaml"], corpus["list.yaml"],
                             corpus["config-truncated.json"], corpus["config-wrong.json"], corpus["missing"]]
    hardware = ["tpu-v7", "gb200", "h200", "host-cpu", "nope", ""]
    chips = ["1", "2", "3", "16", "0", "-1", "x", BIG]
    batch = ["1", "2", "8", "0", "-4", "100000", "1.5", BIG]
    context = ["1", "16", "1024", "100000000", "0", "-1", BIG]
    routing = ["uniform", "identical", "zipf", "zipf:1.2", "zipf:-1", "zipf:x", "trace:" + corpus["trace-bad.json"],
               "trace:" + corpus["missing"], "bogus"]
    schedules = ["published", "naive", "layer-double-buffer", "nope", corpus["schedule-extreme.json"],
                 corpus["schedule-minimal.json"], corpus["schedule-wrong.json"], corpus["truncated.json"],
                 corpus["empty.json"], corpus["garbage.bin"], corpus["missing"]]
    seed = ["0", "1", "-1", "x"]
    formats = ["experts=nvfp4", "experts=int4,attention=bf16", "kv=fp8", "experts=nope", "bogus=bf16", "=", ""]
    plans = ["generic", "k3-tp32", "tp=2", "tp=8,expert_groups=2,expert_tp=4", "tp=x", "tp=0", "nope",
             corpus["wrong-types.yaml"]]
    out = st.integers(0, 10**9).map(lambda n: str(out_root / f"out-{n}"))

    def workload(model_values: list[str]) -> st.SearchStrategy[list[str]]:
        return _flags(st.sampled_from(model_values).map(lambda v: ["--model", v]),
                      st.sampled_from(hardware).map(lambda v: ["--hardware", v]),
                      st.sampled_from(chips).map(lambda v: ["--chips", v]),
                      _opt("--batch", batch), _opt("--context", context), _opt("--routing", routing),
                      _opt("--seed", seed), st.sampled_from([[], ["--force"]]), _opt("--formats", formats),
                      _opt("--plan", plans),
                      st.sampled_from([[], ["--uncalibrated"]]))

    sim_models = models if heavy else [m for m in models if m not in ("kimi-k3", "muse-spark")]
    simulate = _flags(st.just(["simulate"]), workload(sim_models), _opt("--schedule", schedules),
                      _opt("--plot-layers", ["1:3", "0:1", "x", "1:0", "-5:2"]), st.just(["--json"]))
    refused = _flags(st.just(["simulate"]), st.just(["--model", "kimi-k3"]),
                     st.sampled_from([["--hardware", "gb200", "--chips", "2"], ["--hardware", "tpu-v7", "--chips", "3"],
                                      ["--hardware", "tpu-v7", "--chips", "16", "--batch", "100000"],
                                      ["--hardware", "tpu-v7", "--chips", "16", "--context", "100000000"]]),
                     st.sampled_from([[], ["--json"]]))
    floor = _flags(st.just(["floor"]), workload(models if heavy else sim_models), st.sampled_from([[], ["--json"]]))
    sweep = _flags(st.just(["sweep"]), workload(sim_models), out.map(lambda o: ["--out", o]),
                   st.sampled_from([["--budget", "1"], ["--budget", "2"], ["--budget", "0"], ["--budget", "x"]]),
                   st.sampled_from([["--samples", "0"], ["--samples", "-1"], ["--samples", "3"]]),
                   st.sampled_from([["--screen-factor", "0"], ["--screen-factor", "-2"]]),
                   _opt("--space", [corpus["space-bad.json"], corpus["garbage.bin"], corpus["missing"]]),
                   st.just(["--no-plots", "--quiet", "--json"]))
    systems = ["tpu-v7:16", "gb200:2", "gb200:16:graphs", "tpu-v7:0", "tpu-v7", "nope:4", "gb200:4:warp", ",",
               "tpu-v7:3"]
    compare = _flags(st.just(["compare"]), _opt("--model", [*small_models, "kimi-k3", "nope"]),
                     st.lists(st.sampled_from(systems), min_size=1, max_size=2).map(lambda s: ["--systems", ",".join(s)]),
                     _opt("--batch", ["1", "1,8", "0", "x", "", "-1"]),
                     _opt("--spec-acceptance", ["3", "9", "0", "x", "1,100"]),
                     _opt("--draft-tokens", ["7", "0", "-1", "x"]), _opt("--context", context),
                     st.sampled_from([["--schedule", "published"], ["--schedule", "naive"],
                                      ["--schedule", corpus["schedule-wrong.json"]], ["--schedule", corpus["missing"]]]),
                     st.just(["--json"]))
    hardware_cmd, report, calibrate, run_kernel, demo = _file_command_cases(corpus, out, hardware)
    plan = _flags(st.just(["plan"]), st.sampled_from(models).map(lambda v: ["--model", v]),
                  _opt("--hardware", hardware), _opt("--chips", chips), _opt("--devices", chips),
                  _opt("--batch", batch), _opt("--context", context), _opt("--formats", formats),
                  _opt("--plan", plans), st.sampled_from([[], ["--json"]]))
    misapplied = _misapplied_cases(corpus)
    junk = st.lists(st.sampled_from(["--nope", "simulate", "-x", "", "--json", "--model"]), max_size=4)
    issue36 = _issue36_cases(corpus, out_root)
    issue48 = _issue48_cases(corpus, out_root)
    return st.one_of(simulate, refused, floor, sweep, compare, hardware_cmd, report, calibrate, run_kernel, demo,
                     plan, junk, misapplied, misapplied, issue36, issue36, issue48, issue48, issue48)


NANO_TPU = ["--model", "kimi-k3-nano", "--hardware", "tpu-v7", "--chips", "4"]
NANO_GPU = ["--model", "kimi-k3-nano", "--hardware", "gb200", "--chips", "2"]


def _issue36_cases(corpus: dict[str, str], out_root: Path) -> st.SearchStrategy[list[str]]:
    """The classes of issue 36 (module docstring, 6)."""
    special = [corpus[k] for k in corpus if k.startswith("special:")]
    paths = st.one_of(
        st.tuples(st.sampled_from(["--trace", "--plot"]), st.sampled_from(special)).map(
            lambda p: ["simulate", *NANO_TPU, p[0], p[1], "--json"]),
        st.sampled_from(special).map(lambda p: ["sweep", *NANO_TPU, "--out", p, "--budget", "1", "--samples", "0",
                                                "--quiet", "--no-plots"]),
        st.sampled_from(special).map(lambda p: ["run-kernel", "--out", p, "--batch", "0"]),
        st.sampled_from(special).map(lambda p: ["compare", "--systems", "tpu-v7:4", "--model", "kimi-k3-nano",
                                                "--batch", "1", "--schedule", "published", "--plot", p, "--json"]),
    )
    ignored = st.sampled_from([
        ["simulate", *NANO_TPU, "--tokens", "64"], ["simulate", *NANO_TPU, "--prefix-tokens", "8"],
        ["simulate", *NANO_TPU, "--phase", "prefill", "--tokens", "64", "--batch", "4"],
        ["simulate", *NANO_TPU, "--phase", "prefill", "--tokens", "64", "--context", "64"],
        ["simulate", *NANO_GPU, "--schedule", "naive"], ["simulate", *NANO_TPU, "--plot-layers", "1:2"],
        ["compare", "--model", "kimi-k3-nano", "--systems", "tpu-v7:4:eager", "--batch", "1", "--schedule", "naive"],
        ["compare", "--model", "kimi-k3-nano", "--systems", "gb200:2", "--batch", "1", "--schedule", "naive"],
        ["compare", "--model", "kimi-k3-nano", "--systems", "gb200:2", "--batch", "1", "--drafter", "mtp"],
        ["compare", "--model", "kimi-k3-nano", "--systems", "tpu-v7:4", "--batch", "1", "--schedule", "naive",
         "--sweep-budget", "3"],
        ["serving", "--systems", "tpu-v7:16", "--draft-tokens", "3"],
        # controls: the same flags where they are used (must not be refused as ignored)
        ["simulate", *NANO_TPU, "--phase", "prefill", "--tokens", "64"], ["simulate", *NANO_TPU, "--batch", "2"],
    ]).map(lambda argv: [*argv, "--json"])
    base = json.loads(corpus["config-base"])
    config = st.fixed_dictionaries({
        "hidden_size": st.sampled_from([1000, 1024, 4096]), "num_attention_heads": st.sampled_from([7, 8, 32]),
        "num_key_value_heads": st.sampled_from([3, 8, 64]), "head_dim": st.sampled_from([None, 128]),
    }).map(lambda fields: _write_config(out_root, {**base, **fields}))
    configs = st.tuples(config, st.sampled_from([["floor"], ["plan", "--devices", "1"]])).map(
        lambda c: [*c[1], "--model", c[0], *([] if c[1][0] == "plan" else ["--hardware", "tpu-v7", "--chips", "8"])])
    same = st.tuples(st.sampled_from(["1", "2", "4"]), st.sampled_from(["published", "naive"])).map(
        lambda c: ["same-question", c[0], c[1]])
    return st.one_of(paths, ignored, configs, same)


MUST_REFUSE = "must-refuse"  # argv[0] of an issue-48 case: the rest must exit 2 with one error line
SWEEP_NANO = ["sweep", *NANO_TPU, "--budget", "1", "--samples", "0", "--quiet", "--no-plots"]
# (command prefix, flag, kind) of every number a user types; kind "whole" refuses 1.5 too
NUMBERS: list[tuple[list[str], str, str]] = [
    *((["floor", *NANO_TPU], flag, "whole") for flag in ("--chips", "--batch", "--context", "--seed")),
    *((["simulate", *NANO_TPU], flag, "whole") for flag in ("--batch", "--context", "--seed")),
    (["simulate", *NANO_TPU, "--phase", "prefill"], "--tokens", "whole"),
    (["simulate", *NANO_TPU, "--phase", "prefill"], "--prefix-tokens", "whole"),
    *(([*SWEEP_NANO, "--out", "OUT"], flag, "whole") for flag in ("--budget", "--jobs", "--samples", "--screen-factor",
                                                                  "--screen-layers", "--seed")),
    *((["compare", "--model", "kimi-k3-nano", "--systems", "tpu-v7:4", "--schedule", "naive"], flag, "whole")
      for flag in ("--context", "--seed")),
    (["compare", "--model", "kimi-k3-nano", "--systems", "tpu-v7:4"], "--sweep-budget", "whole"),
    (["compare", "--model", "kimi-k3-nano", "--systems", "tpu-v7:4", "--schedule", "naive"], "--batch", "list"),
    (["compare", "--model", "kimi-k3-nano", "--systems", "tpu-v7:4", "--schedule", "naive"], "--spec-acceptance",
     "list"),
    *((["serving", "--model", "kimi-k3-nano", "--systems", "tpu-v7:4"], flag, "whole")
      for flag in ("--input-tokens", "--output-tokens", "--requests", "--seed", "--jobs", "--context-bucket")),
    (["serving", "--model", "kimi-k3-nano", "--systems", "tpu-v7:4"], "--acceptance-length", "real"),
    (["serving", "--model", "kimi-k3-nano", "--systems", "tpu-v7:4"], "--random-range-ratio", "real"),
    (["serving", "--model", "kimi-k3-nano", "--systems", "tpu-v7:4"], "--concurrency", "list"),
    (["plan", "--model", "kimi-k3-nano"], "--devices", "whole"),
    (["calibrate", "--hardware", "tpu-v7", "--measurements", "published:tpu7x-musespark", "--out", "OUT"],
     "--max-evals", "whole"),
    *((["run-kernel", "--schedule", "naive"], flag, "whole") for flag in ("--batch", "--steps", "--context", "--seed")),
    (["demo", "--out", "OUT"], "--sweep-budget", "whole"), (["demo", "--out", "OUT"], "--jobs", "whole"),
    (["lower", "--model", "kimi-k3-nano", "--schedule", "naive"], "--weight-banks", "whole"),
]
BAD_NUMBERS = {"whole": ["nan", "inf", "-1", "1.5", "", "1e400", "1e3"], "real": ["nan", "inf", "-1", "", "1e400"],
               "list": ["nan", "1,,2", "1,", ",1", "", "1,inf", "-1"]}
BAD_LISTS: list[list[str]] = [  # duplicate keys and empty items in key=value and comma lists
    ["floor", *NANO_TPU, "--formats", "experts=fp8,experts=bf16"], ["floor", *NANO_TPU, "--formats", "experts=fp8,"],
    ["floor", *NANO_TPU, "--plan", "tp=4,tp=2"], ["floor", *NANO_TPU, "--plan", "tp=4,,expert_tp=1"],
    ["compare", "--model", "kimi-k3-nano", "--systems", "tpu-v7:4,,gb200:2", "--schedule", "naive"],
    [*SWEEP_NANO, "--out", "OUT", "--space", "joint", "--batches", "1,,2"],
    ["floor", *NANO_TPU, "--routing", "zipf:nan"], ["floor", *NANO_TPU, "--routing", "zipf:inf"],
    ["floor", *NANO_TPU, "--routing", "zipf:1e9"],
]
CONTEXT_FREE: list[list[str]] = [  # a flag that has no effect where it is given
    [*SWEEP_NANO, "--out", "OUT", "--scheduler", "tcp://127.0.0.1:1"], [*SWEEP_NANO, "--out", "OUT", "--workers", "2"],
    [*SWEEP_NANO, "--out", "OUT", "--executor", "dask"], [*SWEEP_NANO, "--out", "OUT", "--weight-banks", "2"],
    [*SWEEP_NANO, "--out", "OUT", "--schedule", "published"],  # an abbreviation of --scheduler
    ["floor", "--mod", "kimi-k3-nano", "--hardware", "tpu-v7", "--chips", "4"],
    ["simulate", *NANO_TPU, "--force"], ["floor", *NANO_TPU, "--force"],
    ["simulate", *NANO_TPU, "--plot", "OUT.txt"], ["simulate", *NANO_TPU, "--trace", "OUT.png"],
    ["simulate", *NANO_TPU, "--plot", "OUT.png", "--plot-layers", "200:3"],
    ["plan", "--model", "kimi-k3-nano", "--hardware", "tpu-v7", "--chips", "4", "--devices", "3"],
    ["plan", "--model", "kimi-k3-nano", "--chips", "4"],
    ["demo", "--quick", "--sweep-budget", "200", "--out", "OUT"],
    ["calibrate", "--hardware", "tpu-v7", "--measurements", "published:tpu7x-musespark", "--quick", "--out", "OUT"],
    ["diff", "published", "naive", "--hardware", "gb200", "--chips", "2", "--model", "kimi-k3-nano"],
    ["diff", "published", "naive", "--model", "kimi-k3-nano", "--chips", "4", "--plot-layers", "1:2"],
    ["--local-dir", "FILE", "hardware", "list"], ["overlays", "list", "--local-dir", "/dev/full"],
]
CONFIG_BAD = [("hidden_size", "2048"), ("hidden_size", 2048.0), ("num_hidden_layers", 10**9),
              ("num_hidden_layers", 1e9), ("head_dim", 0), ("num_attention_heads", True), ("vocab_size", -1),
              ("rms_norm_eps", "1e-6"), ("rms_norm_eps", 0), ("architectures", ["FooBarForCausalLM"])]


def _issue48_cases(corpus: dict[str, str], out_root: Path) -> st.SearchStrategy[list[str]]:
    """The classes of issue 48 (module docstring, 7): each case carries one bad value and must be refused."""
    def place(argv: list[str], n: int) -> list[str]:
        where = {"OUT": str(out_root / f"i48-{n}"), "FILE": corpus["empty.yaml"], "OUT.txt": str(out_root / "p.txt"),
                 "OUT.png": str(out_root / "p.png")}
        return [MUST_REFUSE, *(where.get(a, a) for a in argv)]

    numbers = st.sampled_from(NUMBERS).flatmap(lambda case: st.sampled_from(BAD_NUMBERS[case[2]]).map(
        lambda value: [*case[0], case[1], value]))
    base = json.loads(corpus["config-base"])
    configs = st.sampled_from(CONFIG_BAD).map(lambda kv: ["plan", "--devices", "2", "--model", _write_config(
        out_root, {**base, kv[0]: kv[1]}, name=f"bad-{kv[0]}-{kv[1]!r}")])
    return st.tuples(st.one_of(numbers, st.sampled_from(BAD_LISTS), st.sampled_from(CONTEXT_FREE), configs),
                     st.integers(0, 10**6)).map(lambda c: place(*c))


def _write_config(out_root: Path, data: dict, *, name: str | None = None) -> str:
    """A drawn config.json in a folder of its own; returns its path."""
    fields = {k: v for k, v in data.items() if v is not None}
    if data.get("head_dim") is None:
        fields.pop("head_dim", None)
    key = name or "-".join(str(fields.get(k)) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                                         "head_dim"))
    key = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    folder = out_root.parent / "configs" / key
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fields))
    return str(folder / "config.json")


def ignored_flag(argv: list[str]) -> str | None:
    """The flag in ``argv`` its path does not use, decided here from the argument list alone."""
    if argv[:1] == ["simulate"]:
        prefill = _value(argv, "--phase", "decode") == "prefill"
        for flag in ("--tokens", "--prefix-tokens") if not prefill else ("--batch", "--context"):
            if flag in argv:
                return flag
        if "--schedule" in argv and _value(argv, "--hardware", "") in ("gb200", "h200", "b200", "b300"):
            return "--schedule"
        if "--plot-layers" in argv and "--plot" not in argv:
            return "--plot-layers"
    if argv[:1] == ["compare"]:
        systems = _value(argv, "--systems", "")
        if "tpu" in systems and any(s.split(":")[2:] not in ([], ["megakernel"]) for s in systems.split(",")
                                    if s.startswith("tpu")):
            return "--systems"
        if "--schedule" in argv and all(not s.startswith("tpu") and ":megakernel" not in s for s in systems.split(",")):
            return "--schedule"
        if "--drafter" in argv and "--spec-acceptance" not in argv:
            return "--drafter"
        if "--sweep-budget" in argv and _value(argv, "--schedule", "best") != "best":
            return "--sweep-budget"
    if argv[:1] == ["serving"] and "--draft-tokens" in argv and "--acceptance-length" not in argv:
        return "--draft-tokens"
    return None


def inconsistent_config(argv: list[str]) -> str | None:
    """What a drawn ``config.json`` contradicts in itself (None: consistent), from its raw keys."""
    path = _value(argv, "--model", "")
    if not path.endswith("config.json") or "/configs/" not in path:
        return None
    data = json.loads(Path(path).read_text())
    hidden, heads, kv = data["hidden_size"], data["num_attention_heads"], data["num_key_value_heads"]
    if "head_dim" not in data and hidden % heads:
        return f"hidden {hidden} not a multiple of {heads} heads (no head_dim)"
    if kv > heads or heads % kv:
        return f"{kv} KV heads for {heads} heads"
    return None


def same_question(argv: list[str]) -> Outcome:
    """``simulate`` and ``compare --schedule S`` of one question; the outcome carries a problem
    when their step times differ (one answer per question)."""
    batch, schedule = argv[1], argv[2]
    workload = ["--model", "kimi-k3-nano", "--batch", batch, "--uncalibrated"]
    one = run_case(["simulate", *workload, "--hardware", "tpu-v7", "--chips", "4", "--schedule", schedule, "--json"])
    two = run_case(["compare", *workload, "--systems", "tpu-v7:4", "--schedule", schedule, "--json"])
    outcome = Outcome(argv, max(one.code, two.code), one.stdout, one.stderr + two.stderr, one.problems + two.problems)
    if one.code == 0 and two.code == 0:
        simulated = json.loads(one.stdout)["step_ms"]
        row = next(r for r in json.loads(two.stdout) if r["acceptance_length"] is None)
        if row.get("fits") and row.get("schedule") in (None, schedule) and abs(row["step_ms"] - simulated) > 1e-9 * simulated:
            outcome.problems.append(f"confident wrong answer: simulate {simulated:.6f} ms vs compare "
                                    f"{row['step_ms']:.6f} ms for the same question")
    return outcome


def _misapplied_cases(corpus: dict[str, str]) -> st.SearchStrategy[list[str]]:
    """The semantic half (module docstring, 5): an otherwise valid ``floor`` / ``simulate`` /
    ``plan`` case carrying one input misapplied to its model (or, as controls, valid inputs
    that look odd: numbers as text, a checkpoint folder)."""
    models = ["kimi-k3-mini", "kimi-k3-draft", "llama-3.2-1b", corpus["config-text-number.json"],
              corpus["checkpoint-folder"]]
    misapply = st.sampled_from([
        ["--plan", "muse-tp8"], ["--plan", "k3-nano-tp8"], ["--plan", corpus["plan-other-heads.yaml"]],
        ["--formats", "experts=fp8"], ["--formats", "shared_expert=fp8"], ["--formats", "latent_proj=int8"],
        ["--formats", "dense_mlp=fp8"], ["--formats", "router=bf16,kv=fp8"], []])
    command = st.sampled_from([["floor"], ["simulate"], ["simulate", "--schedule", corpus["schedule-bool.json"]],
                               ["plan"], ["floor", "--model", corpus["config-text-count.json"]]])
    return st.tuples(command, st.sampled_from(models), misapply, st.sampled_from([[], ["--json"]])).map(
        lambda parts: [*parts[0], *([] if "--model" in parts[0] else ["--model", parts[1]]),
                       "--hardware", "tpu-v7", "--chips", "4", *parts[2], *parts[3]])


def _raw_plan(plan_arg: str) -> dict | None:
    """The plan YAML ``--plan`` names, as parsed, or None (none given, a SPEC, an unknown
    name, a corrupt file: nothing misapplied to a model)."""
    import yaml

    from tpusim.workload.model_catalog import MODELS_DIR

    if not plan_arg:
        return None
    path = Path(plan_arg) if plan_arg.endswith(".yaml") else MODELS_DIR / f"plan-{plan_arg}.yaml"
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None
    wanted = {"name": str, "devices": int, "attention_heads_per_device": int}
    if not isinstance(raw, dict) or not all(isinstance(raw.get(k), t) for k, t in wanted.items()):
        return None
    dp = raw.get("attention_dp", 1)
    return raw if raw["devices"] >= 1 and isinstance(dp, int) and dp >= 1 else None


def misapplication(argv: list[str]) -> str | None:
    """What in ``argv`` is misapplied to its model, decided independently of the CLI's checks:
    the raw plan YAML's ``model`` and head split against the model's shapes, the families
    ``--formats`` names against the model's weights, and the corpus files built to be wrong."""
    import math

    from tpusim.workload.model_catalog import load_model
    from tpusim.workload.sharding import attention_heads

    model_arg = _value(argv, "--model", "")
    if model_arg.endswith("config-text-count.json"):
        return "a layer count written as text that is not a number"
    if _value(argv, "--schedule", "").endswith("schedule-bool.json"):
        return "a schedule count given as a boolean"
    try:
        model = load_model(model_arg)
    except Exception:
        return None
    raw = _raw_plan(_value(argv, "--plan", ""))
    if raw is not None:
        if raw.get("model") not in (None, model.name.partition("@")[0]):
            return f"plan {raw['name']} written for {raw['model']}"
        tp = raw["devices"] // raw.get("attention_dp", 1)
        if raw["attention_heads_per_device"] != math.ceil(attention_heads(model) / tp):
            return f"plan {raw['name']}: another head split"
    moe = model.moe
    lacks = {"experts": moe is None, Family.ROUTER: moe is None,
             Family.SHARED_EXPERT: moe is None or not moe.shared_intermediate_size,
             Family.LATENT_PROJ: moe is None or not moe.latent_size, Family.DENSE_MLP: not model.dense_layers}
    for pair in _value(argv, "--formats", "").split(","):
        family = pair.partition("=")[0].strip()
        if lacks.get(family):
            return f"--formats {pair} for a family {model.name} lacks"
    return None


def run_case(argv: list[str]) -> Outcome:
    """Run one argument list through ``main`` in-process and capture everything."""
    from tpusim.app.cli import main

    if argv[:1] == ["same-question"]:
        return same_question(argv)
    if argv[:1] == [MUST_REFUSE]:
        started = time.monotonic()
        outcome = run_case(argv[1:])
        seconds = time.monotonic() - started
        outcome.argv = argv
        if seconds > HANG_S:
            outcome.problems.append(f"hang: {seconds:.0f} s (> {HANG_S} s) before answering")
        return outcome
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
        except BaseException:
            return Outcome(argv, -1, stdout.getvalue(), stderr.getvalue(), [traceback.format_exc()])
    return Outcome(argv, code, stdout.getvalue(), stderr.getvalue())


def _value(argv: list[str], flag: str, default: str) -> str:
    """The value after ``flag`` in ``argv`` (``default`` when absent or last)."""
    index = argv.index(flag) + 1 if flag in argv else len(argv)
    return argv[index] if index < len(argv) else default


def _independent_fit(argv: list[str]) -> bool | None:
    """Does the case's model fit its system? Recomputed here, not read from the output."""
    from hwmodels.catalog import make_system
    from tpusim.workload.capacity import capacity_report
    from tpusim.workload.format_choice import apply_formats
    from tpusim.workload.model_catalog import load_model, plan_for_system

    try:
        model = apply_formats(load_model(_value(argv, "--model", "")), _value(argv, "--formats", "") or None)
        system = make_system(_value(argv, "--hardware", ""), int(_value(argv, "--chips", "1")))
        plan = plan_for_system(model, system.chip, system.chips, _value(argv, "--plan", "") or None)
        report = capacity_report(model, plan, system.chip, batch=int(_value(argv, "--batch", "1")),
                                 context_tokens=int(_value(argv, "--context", "1024")))
    except Exception:
        return None
    return report.fits


def check_outcome(outcome: Outcome, out_root: Path) -> list[str]:
    """The invariants of the module docstring; returns the problems found."""
    problems = list(outcome.problems)
    if outcome.argv[:1] == [MUST_REFUSE]:  # issue 48: the case carries one bad value, refused in one line
        errors = [line for line in outcome.stderr.splitlines() if line.strip()]
        if outcome.code == 0:
            problems.append(f"accepted and ignored: exit 0 for {' '.join(outcome.argv[1:])}")
        elif outcome.code != 2 or len(errors) != 1 or ": error: " not in errors[0]:
            problems.append(f"not one line and exit 2: exit {outcome.code}, {len(errors)} stderr lines")
        outcome = Outcome(outcome.argv[1:], outcome.code, outcome.stdout, outcome.stderr)
    if outcome.code not in (0, 2):
        problems.append(f"exit {outcome.code}")
    if "Traceback (most recent call last)" in outcome.stdout + outcome.stderr:
        problems.append("traceback printed")
    if outcome.code == 2 and outcome.argv and outcome.argv[0] in ("simulate", "floor", "sweep", "compare",
                                                                  "calibrate", "report", "run-kernel", "demo"):
        errors = [line for line in outcome.stderr.splitlines() if "error:" in line]
        if len(errors) != 1:
            problems.append(f"expected one error line, got {len(errors)}")
    for path in out_root.rglob("*"):
        if path.is_file() and path.name.endswith(".tmp"):
            problems.append(f"temporary file left: {path}")
        elif path.is_file() and path.suffix == ".json":
            try:
                json.loads(path.read_text())
            except (ValueError, UnicodeDecodeError):
                problems.append(f"half-written JSON: {path}")
        elif path.is_file() and path.suffix == ".jsonl":
            for line in path.read_text().splitlines():
                try:
                    json.loads(line)
                except ValueError:
                    problems.append(f"half-written JSON line in {path}")
    if outcome.code == 0 and outcome.argv[:1] and outcome.argv[0] in ("simulate", "floor", "sweep"):
        fits = _independent_fit(outcome.argv)
        if fits is False and "does not fit" not in outcome.stdout:
            problems.append("exit 0 for a deployment that does not fit, without the label 'does not fit'")
        if fits is False and "--force" not in outcome.argv:
            problems.append("exit 0 for a deployment that does not fit, without --force")
    ignored = ignored_flag(outcome.argv)
    if ignored and outcome.code == 0:
        problems.append(f"silently accepted: {ignored} is not used on this path but the run exited 0")
    broken = inconsistent_config(outcome.argv)
    if broken and outcome.code == 0:
        problems.append(f"confident wrong answer: a config that contradicts itself ({broken}) ran")
    problems += _special_paths_intact(outcome.argv)
    wrong = misapplication(outcome.argv) if outcome.argv[:1] in (["floor"], ["simulate"], ["plan"]) else None
    if wrong and outcome.code == 0 and "warning" not in outcome.stdout + outcome.stderr:
        problems.append(f"silent misapplication: {wrong} ran without an error or a warning")
    if outcome.code == 0 and outcome.argv[:1] == ["compare"] and "--json" in outcome.argv:
        for row in json.loads(outcome.stdout):
            if not row.get("fits", True) and row.get("step_ms") is not None:
                problems.append(f"compare row {row['system']} does not fit but has a step time")
    return problems


def _special_paths_intact(argv: list[str]) -> list[str]:
    """The output-path class: what the special paths were, they still are."""
    import stat

    problems = []
    for arg in argv:
        path = Path(arg)
        if path.parent.name != "special" or path.parent.parent.name != "corpus":
            continue
        if path.name in ("fifo",) and not stat.S_ISFIFO(os.lstat(path).st_mode):
            problems.append(f"destroyed: {path} is no longer a FIFO")
        if path.name in ("link.json", "dangling.json", "link-fifo") and not path.is_symlink():
            problems.append(f"destroyed: {path} is no longer a symlink")
    return problems


@dataclass
class Tally:
    cases: int = 0
    failures: list[tuple[list[str], list[str]]] = field(default_factory=list)
    by_command: dict[str, int] = field(default_factory=dict)
    misapplied: int = 0  # cases misapplying an input (module docstring, 5)
    silent: int = 0  # of those, exit 0 without an error or a warning
    tracebacks: int = 0
    silently_accepted: int = 0  # an ignored flag with exit 0
    refusal_cases: int = 0  # issue 48's classes: cases carrying one bad value
    accepted_and_ignored: int = 0  # of those, exit 0
    hangs: int = 0  # cases answering after HANG_S
    wrong_answers: int = 0  # a self-contradicting config that ran, or two answers to one question


def fuzz(tally: Tally, work: Path, *, examples: int, heavy: bool, seed: int | None = None) -> None:
    """Run ``examples`` drawn cases, recording every case and failure in ``tally``."""
    corpus = write_corpus(work / "corpus")
    out_root = work / "outputs"
    out_root.mkdir(parents=True, exist_ok=True)

    @settings(max_examples=examples, deadline=None, database=None, derandomize=seed is not None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(argv=cases(corpus, out_root, heavy=heavy))
    def one(argv: list[str]) -> None:
        outcome = run_case(argv)
        tally.cases += 1
        key = (argv[1] if argv[:1] == [MUST_REFUSE] and len(argv) > 1 else argv[0]) if argv else "(none)"
        tally.by_command[key] = tally.by_command.get(key, 0) + 1
        problems = check_outcome(outcome, out_root)
        if argv[:1] in (["floor"], ["simulate"], ["plan"]) and misapplication(argv):
            tally.misapplied += 1
        tally.silent += any(p.startswith("silent misapplication") for p in problems)
        tally.tracebacks += any(p == "traceback printed" or p.startswith("Traceback") for p in problems)
        tally.silently_accepted += any(p.startswith("silently accepted") for p in problems)
        tally.wrong_answers += any(p.startswith("confident wrong answer") for p in problems)
        tally.refusal_cases += argv[:1] == [MUST_REFUSE]
        tally.accepted_and_ignored += any(p.startswith("accepted and ignored") for p in problems)
        tally.hangs += any(p.startswith("hang:") for p in problems)
        if problems:
            tally.failures.append((argv, problems))

    one()


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="wall time to fuzz (default 10)")
    parser.add_argument("--heavy", action="store_true", help="also simulate K3 and Muse Spark (slower cases)")
    args = parser.parse_args()
    tally = Tally()
    deadline = time.monotonic() + args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="tpusim-fuzz-") as tmp:
        os.environ["TPUSIM_LOCAL_DIR"] = str(Path(tmp) / "local")  # overlays never touch the real local dir
        rounds = 0
        while time.monotonic() < deadline:
            fuzz(tally, Path(tmp) / f"round-{rounds}", examples=25, heavy=args.heavy)
            rounds += 1
            print(f"[fuzz] {tally.cases} cases, {len(tally.failures)} failures", file=sys.stderr, flush=True)
    print(f"cases tried: {tally.cases}; by command: {json.dumps(tally.by_command, sort_keys=True)}")
    print(f"failures: {len(tally.failures)}; tracebacks: {tally.tracebacks}; misapplied cases: {tally.misapplied}, "
          f"silent misapplications: {tally.silent}; silently accepted flags: {tally.silently_accepted}; "
          f"confident wrong answers: {tally.wrong_answers}")
    print(f"issue 48 classes: {tally.refusal_cases} cases each carrying one bad value; accepted and ignored: "
          f"{tally.accepted_and_ignored}; hangs (> {HANG_S} s): {tally.hangs}")
    for argv, problems in tally.failures[:20]:
        print(f"- tpusim {' '.join(argv)}\n  " + "\n  ".join(p.strip().splitlines()[-1] for p in problems))
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
