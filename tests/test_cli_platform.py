"""Without a TPU the CLI keeps JAX on the CPU (no libtpu start-up noise); a user's
``JAX_PLATFORMS`` and a host with TPU device nodes are left alone."""

from __future__ import annotations

import glob

from tpusim.app.cli import cpu_only_without_a_tpu


def test_no_tpu_sets_cpu_and_a_tpu_host_or_a_users_choice_is_left_alone(monkeypatch):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(glob, "glob", lambda pattern: [])
    cpu_only_without_a_tpu()
    import os

    assert os.environ["JAX_PLATFORMS"] == "cpu"
    monkeypatch.delenv("JAX_PLATFORMS")
    monkeypatch.setattr(glob, "glob", lambda pattern: ["/dev/vfio/0"] if "vfio" in pattern else [])
    cpu_only_without_a_tpu()
    assert "JAX_PLATFORMS" not in os.environ
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    monkeypatch.setattr(glob, "glob", lambda pattern: [])
    cpu_only_without_a_tpu()
    assert os.environ["JAX_PLATFORMS"] == "tpu"
