"""Committing a device call's records: routing traces are never overwritten, decoders kept apart."""

from __future__ import annotations

import json
from pathlib import Path

from calibration.sources.tpu_probes import load_probes, record_decoder
from calibration.tpu_bench.ingest import ingest


def _record(layers: list[list[int]]) -> dict:
    return {"model": "kimi-k3", "shard_of": "k3-tp32", "schedule": "published", "schedule_hash": "h", "batch": 16,
            "provenance": f"run {layers}", "routing": "trace:kimi-k3-h-b16-s0.json", "routing_layers": layers,
            "expert_cap": None}


def _ingest_one(tmp_path: Path, name: str, record: dict) -> dict:
    files = tmp_path / name
    files.mkdir()
    (files / "records.jsonl").write_text(json.dumps(record) + "\n")
    ingest(files, tmp_path / "data")
    return json.loads((tmp_path / "data" / "tpu-v5e-kernel.jsonl").read_text().splitlines()[-1])


def test_a_different_trace_under_a_taken_name_gets_its_own_file(tmp_path):
    first = _ingest_one(tmp_path, "a", _record([[1, 2]]))
    second = _ingest_one(tmp_path, "b", _record([[3, 4]]))
    same = _ingest_one(tmp_path, "c", {**_record([[1, 2]]), "provenance": "a third run"})
    root = tmp_path / "data"
    assert first["routing"] == same["routing"] == "trace:tpu-v5e-routing/kimi-k3-h-b16-s0.json"
    assert second["routing"] != first["routing"]
    assert json.loads((root / first["routing"].removeprefix("trace:")).read_text()) == {"layers": [[1, 2]]}
    assert json.loads((root / second["routing"].removeprefix("trace:")).read_text()) == {"layers": [[3, 4]]}


def test_dequant_probes_are_read_for_one_decoder_and_others_for_all(tmp_path):
    def probe(name: str, decoder: str | None) -> dict:
        params = {"repeats_in_kernel": 4} | ({"decoder": decoder} if decoder else {})
        return {"kind": "probe", "probe": name, "params": params, "check": "ok"}
    path = tmp_path / "probes.jsonl"
    rows = [probe("dequant_fp8_gate_up", None), probe("dequant_fp8_gate_up", "words32"), probe("empty_call", None)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [record_decoder(r) for r in load_probes(path, "bytes")] == ["bytes", "bytes"]
    assert [(r["probe"], record_decoder(r)) for r in load_probes(path, "words32")] == [
        ("dequant_fp8_gate_up", "words32"), ("empty_call", "bytes")]
