from pathlib import Path

import pytest

from testdata import data_root, multi30k


def data_lines() -> list[str]:
    """Which data the run uses: the real samples, or the generated corpus (tests/testdata.py)."""
    root, multi = data_root()[1], multi30k()[1]
    return [f"xf test data: {root}"] + ([f"xf test data, Multi30k: {multi}"] if multi != root else [])


def pytest_report_header(config):
    return data_lines()


def pytest_terminal_summary(terminalreporter):
    for line in data_lines():  # also under -q, which hides the header
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    return multi30k()[0]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """A directory laid out like ../shared/data (multi30k/, wmt14/, wmt_sample/)."""
    return data_root()[0]


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="run the long variants of the fault-injection tests (tests/test_faults.py)")


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
