"""xf translate --compile ahead of time (decoder_step.AotStep, compiling.AotPackages): the exported and
AOTInductor-compiled decoder step gives the eager search's tokens and scores, one package per
model, projection and beams per sentence; a second run loads the packages instead of compiling;
a package that is not this user's own, or does not load, is not used. These build real
packages (inductor's C++), about a minute each on a small CPU."""

import pytest
import torch

from xformer_cli.base import compiling
from xformer_cli.model.transformer import build_model
from xformer_cli.settings.options import DecodingOptions, TranslateOptions
from xformer_cli.decode.decoder_step import AotStep
from xformer_cli.decode.search import search
from xformer_cli.commands.translate import translate

from helpers import assert_same_search, random_batch


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_aot_step_equals_eager_and_a_second_step_loads_its_packages(tmp_path):
    """Beam search (4 beams: the grouped cross-attention) over batches of many shapes, then
    greedy search with a shortlist (rows = sentences, the projection in the graph): the eager search's
    tokens, scores within 1e-4, two packages built; a new step over the same directory (as the
    next run) loads both and builds none, with the same results."""
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=40, d_model=32, d_ff=64, heads=4, encoder_layers=2, decoder_layers=2).eval()
    beam = DecodingOptions(beam_size=4, nbest=2, max_len_b=4)
    greedy = DecodingOptions(beam_size=1, max_len_b=4)
    candidates = torch.tensor([0, 1, 2, 3, 5, 8, 13, 21, 34])  # a shortlist's ids
    generator = torch.Generator().manual_seed(1)
    batches = [random_batch(generator, sentences, longest) for sentences, longest in [(1, 4), (3, 5), (8, 9), (2, 3)]]
    for run in range(2):
        step = AotStep(compiling.AotPackages(tmp_path / "aot"))
        for src in batches:
            assert_same_search(search([model], src, beam, decoder_step=step), search([model], src, beam))
        assert_same_search(search([model], batches[2], greedy, candidates=candidates, decoder_step=step),
                           search([model], batches[2], greedy, candidates=candidates))
        assert (step.graphs, step.loaded) == ((2, 0) if run == 0 else (0, 2)), run
        assert step.compile_seconds > 0
    assert len(list((tmp_path / "aot").glob("*.pt2"))) == 2  # no temporary file left
    # other weights, same config: another package, not the first model's
    other = build_model("tiny", vocab_size=40, d_model=32, d_ff=64, heads=4, encoder_layers=2, decoder_layers=2).eval()
    assert compiling.weights_digest(other) != compiling.weights_digest(model)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_translate_compile_builds_once_and_loads_after(tmp_path, ckpt, sentences, capsys):
    data = tmp_path / "in.txt"
    data.write_text("\n".join(sentences[:6]) + "\n", encoding="utf-8")
    kw = dict(path=(ckpt,), input=str(data), max_len_a=0.5, max_len_b=3, threads=1)
    translate(TranslateOptions(**kw, output=str(tmp_path / "eager.txt")))
    capsys.readouterr()
    said = []
    for run in range(2):
        translate(TranslateOptions(**kw, output=str(tmp_path / f"compiled{run}.txt"), compile=True))
        assert (tmp_path / f"compiled{run}.txt").read_text() == (tmp_path / "eager.txt").read_text()
        said.append(capsys.readouterr().err)
    assert "ahead of time: 1 package(s) built, 0 loaded" in said[0]
    assert "ahead of time: 0 package(s) built, 1 loaded" in said[1]
    # --workers 2: each decoding process loads the package the first run built (one batch of 2
    # sentences each), with the outputs of one process
    translate(TranslateOptions(**kw, output=str(tmp_path / "workers.txt"), compile=True, workers=2, batch_size=2))
    assert (tmp_path / "workers.txt").read_text() == (tmp_path / "eager.txt").read_text()
    err = capsys.readouterr().err
    assert "ahead of time: 0 package(s) built, 2 loaded" in err, err


def test_a_package_others_can_write_or_that_does_not_load_is_not_used(tmp_path, capsys, monkeypatch):
    """Loading a package runs its native code: one writable by others is refused before torch
    sees it; one torch cannot read is warned about in one line, no traceback."""
    packages = compiling.AotPackages(tmp_path / "aot")
    path = packages.path("tiny; fp32")
    compiling.write_private(path, b"not a package")
    assert packages.load("tiny; fp32") is None
    err = capsys.readouterr().err
    assert "ignoring an unreadable compiled package" in err and str(path) in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    path.chmod(0o666)
    monkeypatch.setattr(compiling, "_load_package", lambda p: pytest.fail("loaded"))
    assert packages.load("tiny; fp32") is None
    assert "not loading this compiled package: writable by others" in capsys.readouterr().err
    assert packages.path("tiny; fp32") != packages.path("tiny; bf16")


def test_a_cache_directory_others_can_write_is_not_written_into(tmp_path, capsys):
    """An aot directory of mode 777: one warning naming it and why, and this run's packages go to
    a private temporary directory (it built into the shared one, then refused to load what it
    built: three warnings and a failure, every run)."""
    shared = tmp_path / "aot"
    shared.mkdir()
    shared.chmod(0o777)
    packages = compiling.AotPackages(shared)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{shared}: not using this cache of compiled steps (writable by others (mode 777))" in err[0]
    assert packages.root != shared and compiling.untrusted(packages.root) is None
    assert packages.path("tiny; fp32").parent == packages.root
    private = packages.root
    del packages  # the temporary directory goes with the packages
    assert not private.exists() and list(shared.iterdir()) == []


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_translate_compile_with_an_untrusted_cache_warns_once_and_decodes_the_same(tmp_path, ckpt, sentences, capsys,
                                                                                   monkeypatch):
    """xf's cache (XDG_CACHE_HOME/xf/aot) writable by others: one warning, the eager search's
    output, nothing written into it; the worker processes use their parent's private directory
    (they build one package between them, and say nothing)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    shared = tmp_path / "cache" / "xf" / "aot"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    data = tmp_path / "in.txt"
    data.write_text("\n".join(sentences[:6]) + "\n", encoding="utf-8")
    kw = dict(path=(ckpt,), input=str(data), max_len_a=0.5, max_len_b=3, threads=1, batch_size=2)
    translate(TranslateOptions(**kw, output=str(tmp_path / "eager.txt")))
    capsys.readouterr()
    translate(TranslateOptions(**kw, output=str(tmp_path / "compiled.txt"), compile=True, workers=2))
    err = capsys.readouterr().err
    assert (tmp_path / "compiled.txt").read_text() == (tmp_path / "eager.txt").read_text()
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and f"{shared}: not using this cache of compiled steps" in warnings[0], err
    assert "ahead of time: 1 package(s) built" in err, err
    assert list(shared.iterdir()) == []


def test_a_torch_without_the_package_loader_loads_through_its_public_function(tmp_path, monkeypatch):
    """compiling._load_package makes the package's loader directly (no ISA probe, no archive
    import); a torch whose internals differ goes through aoti_load_package instead."""
    import torch._inductor as inductor

    def no_loader(*args):
        raise TypeError("another signature")

    monkeypatch.setattr(torch._C._aoti, "AOTIModelPackageLoader", no_loader)
    monkeypatch.setattr(inductor, "aoti_load_package", lambda p: ("public", p))
    assert compiling._load_package(tmp_path / "x.pt2") == ("public", str(tmp_path / "x.pt2"))


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_a_change_of_the_compiled_code_builds_anew(tmp_path, monkeypatch):
    """The package key holds a digest of the source compiled into it: the same model, machine
    and code load the package the first step built; a change to that code (here one comment in a
    copy of model/transformer.py) builds a new one instead of running the old code."""
    from xformer_cli.decode import decoder_step

    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=40, d_model=16, d_ff=32, heads=2, encoder_layers=1, decoder_layers=1).eval()
    src = random_batch(torch.Generator().manual_seed(1), 2, 4)
    greedy = DecodingOptions(beam_size=1, max_len_b=3)

    def counts():
        step = AotStep(compiling.AotPackages(tmp_path / "aot"))
        assert_same_search(search([model], src, greedy, decoder_step=step), search([model], src, greedy))
        return step.graphs, step.loaded

    assert counts() == (1, 0)
    assert counts() == (0, 1)  # unchanged code: loaded
    changed = tmp_path / "transformer.py"
    changed.write_text(decoder_step.step_sources()[0].read_text() + "\n# a fix\n")
    assert decoder_step.step_sources()[0].name == "transformer.py"
    sources = decoder_step.step_sources()
    monkeypatch.setattr(decoder_step, "step_sources", lambda: [changed, *sources[1:]])
    decoder_step.source_digest.cache_clear()
    try:
        assert counts() == (1, 0)  # another digest: built, not loaded
    finally:
        monkeypatch.undo()
        decoder_step.source_digest.cache_clear()
