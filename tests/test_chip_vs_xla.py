"""The megakernel-vs-XLA table (:mod:`calibration.reports.chip_vs_xla`) on the committed chip
records: one row per XLA record, the kernel's step from the same run next to it, the same
bytes for both; a malformed file is one line and exit 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from calibration.reports.chip_vs_xla import RECORDS, rows, table

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_chip_vs_xla.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_chip_vs_xla", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_records_pair_each_xla_step_with_its_kernel_run():
    records = [json.loads(line) for line in RECORDS.read_text().splitlines() if line.strip()]
    found = rows(RECORDS)
    assert len(found) == len(records) >= 3
    for record, row in zip(sorted(records, key=lambda r: (r["model"], r["batch"])), found, strict=True):
        assert record["implementation"] == "xla" and record["backend"].startswith("TPU")
        assert row["kernel_ms"] == record["stands_next_to"]["ms_per_step_median"]
        if record.get("shard_of"):  # K3's real widths; 93 random mini layers amplify rounding (chip_numerics)
            assert record["within_tolerance"]
            # 16 rows x 2 checked steps: a near tie may part one row's greedy token (XLA's own
            # fusions reorder sums; its logits 0.66 % off, within tolerance; as the kernel's
            # words32 run at batch 16 did, docs/megakernel-on-tpu.md)
            assert record["tokens_identical"] or record["batch"] >= 16
    text = table(found)
    assert text.count("\n") == len(found) + 1 and "x |" in text


def test_malformed_records_are_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "xla.jsonl"
    bad.write_text('{"model": "kimi-k3"}\n')
    assert _bench().main(["--records", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--records" in err
