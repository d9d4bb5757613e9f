from pathlib import Path

import pytest
import torch

from helpers import learn_spm, make_data, slice_multi30k, tiny_checkpoint, train_tiny
from helpers import data_root, multi30k


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


def pytest_configure(config):
    config.addinivalue_line("markers", "kernels: a test whose result rests on the CPU's own kernels (int8, bf16, "
                                       "compiled graphs); tests/test_cpu_kinds.py runs these again capped at AVX2")


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


# -- shared fixtures (helpers.py has the builders behind them) ------------------------------------
@pytest.fixture(scope="session")
def raw_slice(tmp_path_factory, multi30k_dir) -> Path:
    return slice_multi30k(multi30k_dir, tmp_path_factory.mktemp("m30k-raw"), 160, 40)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory, raw_slice) -> Path:
    return make_data(raw_slice, tmp_path_factory.mktemp("m30k") / "bin", 300)


@pytest.fixture(autouse=True, scope="session")
def private_xf_cache(tmp_path_factory):
    """xf's per-user cache (compiled decoder steps, int8 engine timings: compiling.cache_dir) in a
    directory of this test run, never the user's own; processes the tests start inherit it."""
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    yield
    patch.undo()


@pytest.fixture(scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def spm_model(multi30k_dir) -> bytes:
    lines = []
    for lang in ("en", "de"):
        lines += (multi30k_dir / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:300]
    return learn_spm(lines)


@pytest.fixture(scope="module")
def ckpt(spm_model, tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny.pt", spm_model, seed=0)


@pytest.fixture(scope="module")
def sentences(multi30k_dir):
    return (multi30k_dir / "test2016.en").read_text(encoding="utf-8").splitlines()[:7]


@pytest.fixture(scope="session")
def trained_tiny(multi30k_dir, tmp_path_factory) -> Path:
    """checkpoint_last.pt of helpers.train_tiny (data beside it in ../../data), trained once a session:
    the export tests (CTranslate2, Hugging Face) share it."""
    return train_tiny(multi30k_dir, tmp_path_factory.mktemp("trained"))
