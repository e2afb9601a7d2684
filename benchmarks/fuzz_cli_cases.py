"""What the CLI fuzz draws: the corpus of corrupt and extreme input files, and the argument
lists (hypothesis strategies) for every subcommand and every class of issues 36 and 48.

The other half, running a case and judging it against oracles written independently of the
CLI, is ``benchmarks/fuzz_cli.py`` (its docstring lists the invariants and what each class
must do). This module only decides *what* is tried; nothing here reads an outcome. Two argv
markers tell the runner how to treat a case: :data:`SAME_QUESTION` (run ``simulate`` and
``compare`` of one question) and :data:`MUST_REFUSE` (the rest must exit 2 in one line).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import strategies as st

from tpusim.workload.registry.names import Family

BIG = str(10**12)
SAME_QUESTION = "same-question"  # argv[0] of an issue-36 case: simulate and compare must agree


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
        lambda c: [SAME_QUESTION, c[0], c[1]])
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
