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


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` are skipped, saying why, on a machine without a CUDA device."""
    cuda_tests = [item for item in items if "cuda" in item.keywords]
    if not cuda_tests:
        return
    import torch

    if torch.cuda.is_available():
        return
    reason = f"needs a CUDA device (torch {torch.__version__} sees none); bench/gpu.sh runs these on a GPU"
    for item in cuda_tests:
        item.add_marker(pytest.mark.skip(reason=reason))
