import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO / ".." / "shared" / "data").resolve()


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    path = Path(os.environ.get("MULTI30K_DIR", SHARED_DATA / "multi30k"))
    if not (path / "train.en").exists():
        pytest.skip(f"Multi30k not found at {path}")
    return path


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="run the long variants of the fault-injection tests (tests/test_faults.py)")
