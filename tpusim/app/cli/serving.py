"""`tpusim serving`: a served workload on several systems: TTFT, TPOT, tokens/s per chip and per user.

Usage::

    tpusim serving --model kimi-k3 --systems tpu-v7:16,gb200:16 --concurrency 1,16,64 \
        --input-tokens 8192 --output-tokens 1024 --json
    tpusim serving ... --rate 0.5 --requests 200
    tpusim serving ... --trace requests.jsonl        # {arrival_s, input_tokens, output_tokens} per line
    tpusim serving ... --sweep-concurrency 1,4,16,64 --plot curve.png

One record per (system, traffic level) (:func:`tpusim.serving.serve.serving_rows`):
``ttft_ms`` and ``tpot_ms`` (mean, p50, p90, p99), ``output_tokens_per_s_per_chip``,
``tokens_per_s_per_user``, what bounds each (``ttft_bound``, ``tpot_bound``,
``ttft_parts_ms``, ``tpot_parts_ms``, ``kv_bound``, ``batch_bound``), the plan and the
step model's grid (``step_model``) and the assumptions. All simulated.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from hwmodels import values
from hwmodels.errors import InputError
from tpusim.app.cli.common import add_model_options, add_systems_option, jobs, png_file
from tpusim.app.cli.flag_rules import refuse_unused
from tpusim.app.tables import TableData, add_format_option, emit, output_format
from tpusim.cli_options import add_model_option, finite_number, positive_int, seed_value


def _list(text: str, kind: type, name: str) -> list[Any]:
    """A comma-separated list of finite numbers > 0, none empty (:mod:`hwmodels.values`)."""
    return values.number_list(text, name, kind=kind, minimum=0, exclusive_minimum=True)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "serving", help="simulate a served workload: TTFT, TPOT, tokens/s per chip and per user",
        description="Simulate requests arriving at a serving engine (continuous batching, chunked prefill, "
        "KV capacity from the HBM check, optional speculative decoding) on each system, with step times "
        "from the engine at grid points (interpolated between). Prints TTFT and TPOT (mean, p50, p90, p99), "
        "output tokens/s per chip and per user, and what bounds each.")
    add_model_option(parser, default="kimi-k3")
    add_model_options(parser)
    add_systems_option(parser, default="tpu-v7:16,gb200:16")
    traffic = parser.add_mutually_exclusive_group()
    traffic.add_argument("--concurrency", default=None,
                         help="comma-separated closed-loop client counts (default: 1 when no traffic is given)")
    traffic.add_argument("--sweep-concurrency", default=None,
                         help="like --concurrency; also draws the throughput-latency curve (--plot)")
    traffic.add_argument("--rate", default=None, help="comma-separated Poisson arrival rates, requests/s")
    traffic.add_argument("--trace", type=Path, default=None,
                         help="JSON lines (or a JSON list) of {arrival_s, input_tokens, output_tokens}")
    parser.add_argument("--input-tokens", type=positive_int, default=8192, help="prompt tokens per request (the longest, with lengths drawn: --random-range-ratio)")
    parser.add_argument("--output-tokens", type=positive_int, default=1024, help="output tokens per request (the longest, with lengths drawn: --random-range-ratio)")
    parser.add_argument("--random-range-ratio", type=finite_number(0.0, 1.0), default=None, metavar="R",
                        help="request lengths uniform in [L x R, L] for L = --input-tokens / --output-tokens, "
                        "as SGLang bench_serving's random dataset draws them; 1 = fixed lengths "
                        "(default: 0, bench_serving's default)")
    parser.add_argument("--requests", type=positive_int, default=None,
                        help="requests per traffic level (default: 4 x concurrency, at least 8; 64 with --rate)")
    parser.add_argument("--max-running-requests", type=positive_int, default=None,
                        help="requests running at once (default: what KV and on-chip memory allow)")
    parser.add_argument("--chunk-tokens", type=positive_int, default=None,
                        help="prefill tokens per step (default: 16384, SGLang's chunked_prefill_size on >= 160 GB GPUs)")
    parser.add_argument("--decode-first", action="store_true",
                        help="prefill only when nothing decodes (default: prefill first, as SGLang)")
    parser.add_argument("--first-token-from-prefill", action="store_true",
                        help="the prefill step emits the first token (default: the first decode step after it)")
    parser.add_argument("--acceptance-length", type=finite_number(1.0), default=1.0,
                        help="speculative decoding: accepted draft tokens + 1 per step (default: 1, no speculation)")
    parser.add_argument("--drafter", default=None, help="drafter for --acceptance-length > 1 (as tpusim compare)")
    parser.add_argument("--draft-tokens", type=positive_int, default=None, help="draft tokens per step")
    parser.add_argument("--context-bucket", type=positive_int, default=1024,
                        help="context grid of the step cache, tokens (exact at multiples, linear between)")
    parser.add_argument("--seed", type=seed_value, default=0, help="seed of the routing draw and Poisson arrivals")
    parser.add_argument("--jobs", type=jobs, default=None,
                        help="processes serving the systems in parallel (default: one per system, up to the CPUs)")
    parser.add_argument("--uncalibrated", action="store_true", help="published catalog figures only")
    parser.add_argument("--plot", type=png_file, default=None,
                        help="write the throughput-latency curve (tokens/s per chip vs per user) as PNG")
    add_format_option(parser)
    parser.set_defaults(func=run)


def traffics_from(args: argparse.Namespace) -> list[Any]:
    """The traffic levels the arguments ask for."""
    from tpusim.serving.config import Traffic, load_trace

    common: dict[str, Any] = {"input_tokens": args.input_tokens, "output_tokens": args.output_tokens,
                              "seed": args.seed}
    if args.random_range_ratio is not None:
        if not 0.0 <= args.random_range_ratio <= 1.0:
            raise InputError(f"--random-range-ratio {args.random_range_ratio}: must be in [0, 1]")
        common["range_ratio"] = args.random_range_ratio
    if args.trace is not None:
        return [Traffic(mode="trace", trace=load_trace(args.trace), **common)]
    if args.rate is not None:
        return [Traffic(mode="rate", rate_per_s=rate, requests=args.requests or 64, **common)
                for rate in _list(args.rate, float, "--rate")]
    flag = "--sweep-concurrency" if args.sweep_concurrency is not None else "--concurrency"
    text = args.sweep_concurrency if args.sweep_concurrency is not None else args.concurrency
    levels = _list("1" if text is None else text, int, flag)  # a typed "" is an empty list, refused
    return [Traffic(mode="concurrency", concurrency=level, requests=args.requests or max(8, 4 * level), **common)
            for level in levels]


def run(args: argparse.Namespace) -> int:
    from tpusim.compare.rows import parse_systems
    from tpusim.serving.config import SchedulerConfig
    from tpusim.serving.serve import serving_rows

    if args.acceptance_length < 1.0:
        raise InputError(f"--acceptance-length {args.acceptance_length}: must be >= 1")
    systems = parse_systems(args.systems)
    refuse_unused(args)  # a typed flag this traffic ignores is an error, not dropped
    traffics = traffics_from(args)
    limits: dict[str, Any] = {"max_running_requests": args.max_running_requests,
                              "prefill_first": not args.decode_first,
                              "first_token_from_prefill": args.first_token_from_prefill,
                              "acceptance_length": args.acceptance_length}
    if args.chunk_tokens:
        limits["chunk_tokens"] = args.chunk_tokens
    jobs = args.jobs or min(len(systems), os.cpu_count() or 1)
    rows = serving_rows(args.model, systems, traffics, jobs=jobs, scheduler=SchedulerConfig(**limits), seed=args.seed,
                        calibrated=not args.uncalibrated, formats=args.formats, plan_choice=args.plan,
                        context_bucket_tokens=args.context_bucket, drafter=args.drafter,
                        draft_tokens=args.draft_tokens)
    if args.plot is not None:
        from tpusim.serving.plot import plot_serving_curves

        try:
            plot_serving_curves(rows, args.plot, title=f"{args.model}: served throughput vs per-user speed (simulated)")
        except OSError as error:
            raise InputError(f"--plot {args.plot}: cannot write ({error.strerror or error})") from None
    fmt = output_format(args)  # JSON: a list of records, each carrying its assumptions
    notes = [f"assumption: {a}" for a in rows[0]["assumptions"]] if rows and fmt != "json" else []
    if rows and fmt != "json":  # the choices the numbers depend on, named once per distinct value
        for key in ("lengths", "arrivals"):
            notes += [f"{key}: {value}" for value in dict.fromkeys(str(row[key]) for row in rows)]
        notes += list(dict.fromkeys(f"weight formats on {row['system']}: {row['formats']}" for row in rows))
    emit(serving_table(rows, title=f"{args.model}: served workload per system (simulated)"), fmt, notes=notes)
    return 0


def _ms(stats: dict[str, float | None]) -> str:
    if stats["mean"] is None:
        return "—"
    return f"{stats['mean']:.1f} ({stats['p50']:.1f} / {stats['p90']:.1f} / {stats['p99']:.1f})"


def serving_table(rows: list[dict[str, Any]], *, title: str) -> TableData:
    """One line per (system, traffic): TTFT, TPOT, throughput, and what bounds them."""
    columns = ["system", "traffic", "TTFT ms mean (p50/p90/p99)", "TPOT ms mean (p50/p90/p99)",
               "tok/s per chip", "tok/s per user", "TTFT bound", "TPOT bound", "limits", "plan"]
    table = TableData(title=title, columns=columns, records=rows,
                      right_aligned=("tok/s per chip", "tok/s per user"))
    for row in rows:
        limits = [f"KV ({row['requests_waiting_for_kv']} waited)"] if row["kv_bound"] else []
        if row.get("batch_bound"):
            limits.append(f"on-chip memory: batch <= {row['max_batch_on_chip']}")
        if row["refused"]:
            limits.append(f"{row['refused']} refused (KV)")
        tpot = _ms(row["tpot_ms"]) + (f" [{row['tpot_ms_low']:.1f}–{row['tpot_ms_high']:.1f}]"
                                      if row.get("tpot_ms_low") is not None else "")
        table.add(row["system"], row["traffic"], _ms(row["ttft_ms"]), tpot,
                  f"{row['output_tokens_per_s_per_chip']:.1f}", f"{row['tokens_per_s_per_user']:.1f}",
                  row["ttft_bound"], row["tpot_bound"], "; ".join(limits) or "—", row["plan"])
    return table
