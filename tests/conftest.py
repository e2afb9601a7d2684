"""Fixtures shared by the test files.

``local_dir`` is autouse: every test gets its own empty folder for machine-local catalog
entries and calibrated overlays (``TPUSIM_LOCAL_DIR``), so no test reads or writes the
user's own calibration, and no test sees another test's overlay.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def local_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty local folder for this test (it may not exist until something writes it)."""
    folder = tmp_path / "local"
    monkeypatch.setenv("TPUSIM_LOCAL_DIR", str(folder))
    return folder
