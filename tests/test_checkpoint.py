"""Checkpoints: what a file that is not one is told, a full disk, the newest intact checkpoint to
resume from, and vocabularies compared by their pieces rather than by their bytes."""

import errno
import io
import os
import zipfile

import numpy as np
import pytest
import sentencepiece as spm
import torch

from xformer_cli.model import checkpoint as ck
from xformer_cli.model.checkpoint import load_checkpoint, load_last_checkpoint, make_checkpoint, same_vocabulary
from xformer_cli.model.checkpoint import save_checkpoint
from xformer_cli.base.errors import XfError
from xformer_cli.model.transformer import build_model


def tiny(path, spm_model=b"stand-in", train_state=None):
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=20, d_model=8, d_ff=16, heads=2)
    save_checkpoint(path, make_checkpoint(model, spm_model, train_state=train_state))
    return path


class Unsafe:
    pass


def not_checkpoints(tmp_path):
    """(file, the reason its error must give) for every kind of file that is not a checkpoint."""
    good = tiny(tmp_path / "good.pt").read_bytes()
    files = {
        "text.pt": (b"the house is small\n" * 20, "not a zip archive"),
        "random.pt": (np.random.default_rng(0).bytes(4096), "not a zip archive"),
        "empty.pt": (b"", "an empty file"),
        "truncated.pt": (good[: len(good) // 2], "a truncated zip archive"),
    }
    for name, (data, why) in files.items():
        (tmp_path / name).write_bytes(data)
        yield tmp_path / name, why
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as z:
        z.writestr("notes.txt", "a zip archive, not a PyTorch file")
    yield tmp_path / "other.zip", "corrupt"
    torch.save({"weights": torch.zeros(2)}, tmp_path / "plain.pt")
    yield tmp_path / "plain.pt", "without the xf header"
    torch.save({"format": "xf-checkpoint", "x": Unsafe()}, tmp_path / "unsafe.pt")
    yield tmp_path / "unsafe.pt", "it holds Python objects other than tensors"
    torch.save({"format": "xf-checkpoint", "version": "1"}, tmp_path / "strversion.pt")
    yield tmp_path / "strversion.pt", "its format version is '1', not a positive integer"


def test_a_file_that_is_not_a_checkpoint_says_so_and_why(tmp_path):
    for path, why in not_checkpoints(tmp_path):
        with pytest.raises(XfError) as e:
            load_checkpoint(path)
        message = str(e.value)
        assert message.startswith(f"{path}: ") and why in message, message
        assert "xf checkpoint" in message and "\n" not in message
        # never the unsafe advice torch's own message gives
        assert "weights_only" not in message and "version 1, this xf reads version 1" not in message


def test_a_corrupt_checkpoint_last_names_the_newest_intact_numbered_one(tmp_path):
    state = {"optimizer": {}}
    for update in (10, 20):
        tiny(tmp_path / f"checkpoint_1_{update}.pt", train_state=state)
    (tmp_path / "checkpoint_1_30.pt").write_bytes(b"half a checkpoint")  # newer, but broken
    tiny(tmp_path / "checkpoint_2_25.pt")  # intact but without training state (an export)
    last = tmp_path / "checkpoint_last.pt"
    last.write_bytes((tmp_path / "checkpoint_1_20.pt").read_bytes()[:500])
    with pytest.raises(XfError, match=r"truncated .*; the newest intact checkpoint is .*checkpoint_1_20\.pt: copy it "
                                      r"to .*checkpoint_last\.pt"):
        load_last_checkpoint(last)
    for p in tmp_path.glob("checkpoint_1_*.pt"):
        p.unlink()
    with pytest.raises(XfError, match="no intact numbered checkpoint is beside it"):
        load_last_checkpoint(last)


def test_a_full_disk_names_the_file_and_the_cause(tmp_path, monkeypatch):
    import contextlib

    class Full(io.RawIOBase):  # a device with room for 1000 bytes
        written = 0

        def writable(self):
            return True

        def write(self, b):
            if self.written + len(b) > 1000:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.written += len(b)
            return len(b)

    real_atomic_write = ck.atomic_write

    @contextlib.contextmanager
    def full_disk(path, mode):  # the real atomic write, its file on a full device
        with real_atomic_write(path, mode):
            yield Full()

    monkeypatch.setattr(ck, "atomic_write", full_disk)
    with pytest.raises(XfError) as e:
        tiny(tmp_path / "checkpoint_last.pt")
    assert str(e.value) == f"cannot write {tmp_path / 'checkpoint_last.pt'}: no space left on device"


def learn(lines, **kw) -> bytes:
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=40,
                                   model_type="bpe", minloglevel=2, pad_id=0, unk_id=1, bos_id=2, eos_id=3, **kw)
    return out.getvalue()


def test_vocabularies_are_compared_by_pieces_not_bytes():
    lines = ["the small house", "a red house", "the man walks", "a woman sees the dog"] * 20
    base = learn(lines)
    # the same vocabulary in other bytes: a trainer setting that is recorded but changes no piece
    same = learn(lines, num_threads=3)
    assert same != base and same_vocabulary(base, same)
    other = learn([line.upper() for line in lines])
    assert not same_vocabulary(base, other)
    assert not same_vocabulary(base, b"not a sentencepiece model")


def test_head_dim_is_recorded_and_a_checkpoint_without_it_loads_unchanged(tmp_path):
    """A checkpoint records the resolved head size; one written before --head-dim existed has
    no head_dim key and loads as d_model / heads, the size it was trained with."""
    torch.manual_seed(0)
    small_heads = build_model("tiny", vocab_size=20, d_model=8, d_ff=16, heads=2, head_dim=3)
    save_checkpoint(tmp_path / "b.pt", make_checkpoint(small_heads, b"stand-in"))
    ckpt = load_checkpoint(tmp_path / "b.pt")
    assert ckpt["model_config"]["head_dim"] == 3
    assert ck.model_from_checkpoint(ckpt).encoder_layers[0].self_attn.in_proj.weight.shape == (18, 8)

    old = load_checkpoint(tiny(tmp_path / "old.pt"))
    assert old["model_config"].pop("head_dim") == 4  # as written before head_dim existed
    model = ck.model_from_checkpoint(old)
    assert model.cfg.head_dim == 4
    src, prev = torch.tensor([[5, 6, 3]]), torch.tensor([[2, 7]])
    torch.manual_seed(0)
    reference = build_model("tiny", vocab_size=20, d_model=8, d_ff=16, heads=2).eval()
    assert torch.equal(model.eval()(src, prev), reference(src, prev))


def test_a_state_dict_that_does_not_fit_its_configuration_is_one_line(tmp_path, spm_model):
    """Regression: load_state_dict's multi-line message reached the terminal as two lines."""
    from typer.testing import CliRunner

    from xformer_cli.cli import app

    ckpt = load_checkpoint(tiny(tmp_path / "m.pt", spm_model))
    ckpt["model_config"] = {**ckpt["model_config"], "d_ff": 32}  # the weights are d_ff 16
    del ckpt["model"]["encoder_layers.0.ffn.fc2.bias"]
    save_checkpoint(tmp_path / "bad.pt", ckpt)
    with pytest.raises(XfError, match=r"bad\.pt: model does not match its configuration: .*Missing key\(s\).*size mismatch"
                       ) as e:
        ck.model_from_checkpoint(load_checkpoint(tmp_path / "bad.pt"), tmp_path / "bad.pt")
    assert "\n" not in str(e.value) and "\t" not in str(e.value)
    result = CliRunner().invoke(app, ["translate", "--path", str(tmp_path / "bad.pt")], input="a\n")
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "model does not match its configuration" in result.stderr
