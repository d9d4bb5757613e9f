"""bergamot_format: Marian's .bin and binary shortlist byte for byte as marian-dev reads them (a
reader here follows src/common/binary.cpp's loadItems and src/data/shortlist.cpp's load and
generate line by line), int8 as marian-conv writes it, and the refusals in one line."""

import json
import struct

import numpy as np
import pytest
import torch
import yaml

from xformer_cli.formats.bergamot import (FLOAT32, INT8, INTGEMM8, SHORTLIST_MAGIC, binary_model, binary_shortlist,
                                         check_int8_shapes, engine_package, hash_mem, is_gemm_weight)
from xformer_cli.base.errors import XfError
from xformer_cli.settings.options import ModelConfig
from xformer_cli.decode.shortlist import Shortlist


def load_items(data: bytes) -> dict:
    """marian-dev binary.cpp loadItems: name -> (type, shape, data bytes, offset of the data)."""
    version, count = struct.unpack_from("<QQ", data, 0)
    assert version == 1
    pos = 16
    headers = [struct.unpack_from("<QQQQ", data, pos + 32 * i) for i in range(count)]
    pos += 32 * count
    names = []
    for name_len, _, _, _ in headers:
        names.append(data[pos : pos + name_len - 1].decode())
        assert data[pos + name_len - 1] == 0
        pos += name_len
    shapes = []
    for _, _, rank, _ in headers:
        shapes.append(struct.unpack_from(f"<{rank}i", data, pos))
        pos += 4 * rank
    (offset,) = struct.unpack_from("<Q", data, pos)
    pos += 8 + offset
    assert pos % 256 == 0
    items = {}
    for name, shape, (_, kind, _, length) in zip(names, shapes, headers):
        items[name] = (kind, shape, data[pos : pos + length], pos)
        pos += length
    assert pos == len(data)
    return items


def test_binary_model_reads_back_as_marian_reads_it():
    rng = np.random.default_rng(0)
    params = {"Wemb": rng.normal(size=(16, 64)), "encoder_l1_self_Wq": rng.normal(size=(64, 128)),
              "encoder_l1_self_bq": rng.normal(size=(1, 128)), "encoder_l1_self_Wo_ln_scale": rng.normal(size=(1, 64))}
    config = {"type": "transformer", "dim-emb": 64}
    items = load_items(binary_model(params, config))
    assert list(items) == sorted(params) + ["special:model.yml"]
    assert all(offset % 256 == 0 for _, _, _, offset in items.values())
    kind, shape, data, _ = items["encoder_l1_self_bq"]
    assert (kind, shape) == (FLOAT32, (1, 128))
    bias = params["encoder_l1_self_bq"][0].astype(np.float32)
    assert np.array_equal(np.frombuffer(data[: 128 * 4], np.float32), bias)
    assert items["encoder_l1_self_Wo_ln_scale"][0] == FLOAT32  # a layer norm is no gemm weight
    # intgemm8: the transposed matrix, one multiplier 127 / max|w| after it (marian-conv's packAndSave)
    kind, shape, data, _ = items["encoder_l1_self_Wq"]
    w = params["encoder_l1_self_Wq"].astype(np.float32)
    (scale,) = struct.unpack_from("<f", data, w.size)
    assert (kind, shape) == (INTGEMM8, (64, 128)) and scale == pytest.approx(127 / np.abs(w).max())
    q = np.frombuffer(data[: w.size], np.int8).reshape(128, 64)
    assert np.abs(q / scale - w.T).max() <= 0.5 / scale + 1e-6
    emb = np.frombuffer(items["Wemb"][2][:16 * 64], np.int8).reshape(16, 64)  # the embeddings stay (V, d)
    assert np.abs(emb / struct.unpack_from("<f", items["Wemb"][2], 16 * 64)[0] - params["Wemb"]).max() < 0.02
    kind, shape, data, _ = items["special:model.yml"]
    assert kind == INT8 and data[shape[0] - 1] == 0  # a C string (Marian reads it as one), then the padding
    assert yaml.safe_load(data[: shape[0] - 1].decode()) == config
    # float32 everywhere when asked
    assert {k for k, *_ in load_items(binary_model(params, config, int8=False)).values()} == {FLOAT32, INT8}


def test_which_weights_are_int8():
    gemm = ["encoder_l1_self_Wq", "decoder_l2_context_Wo", "encoder_l1_ffn_W1", "decoder_ff_logit_out_W", "Wemb",
            "encoder_Wemb"]
    other = ["encoder_l1_self_Wo_ln_scale", "encoder_l1_self_bq", "decoder_ff_logit_out_b", "encoder_Wpos"]
    assert all(map(is_gemm_weight, gemm)) and not any(map(is_gemm_weight, other))


def test_hash_mem_is_marians():
    # boost::hash_combine over std::hash<uint64_t> (the identity), by hand for [1, 2]:
    # seed = 1 + 0x9e3779b9 = 0x9e3779ba; seed ^= 2 + 0x9e3779b9 + (seed << 6) + (seed >> 2)
    first = 0x9E3779BA
    assert hash_mem(np.array([1, 2], np.uint64)) == first ^ (2 + 0x9E3779B9 + (first << 6) + (first >> 2))
    assert hash_mem(np.array([1, 2], np.uint64)) == 0x28CD94BF13


def marian_candidates(blob: bytes, vocab_size: int, source: list[int]) -> set[int]:
    """shortlist.cpp: load (header, size, checksum) and generate (shared vocabulary) for one sentence."""
    magic, checksum, first, _, offsets_len, lists_len = struct.unpack_from("<6Q", blob)
    assert magic == SHORTLIST_MAGIC and len(blob) == 48 + 8 * offsets_len + 4 * lists_len
    assert hash_mem(np.frombuffer(blob[16 : 16 + (len(blob) - 16) // 8 * 8], np.uint64)) == checksum
    offsets = np.frombuffer(blob, np.uint64, offsets_len, 48)
    lists = np.frombuffer(blob, np.uint32, lists_len, 48 + 8 * offsets_len)
    assert offsets[-1] == lists_len and all(np.all(np.diff(lists[a:b]) > 0) for a, b in zip(offsets, offsets[1:]))
    chosen = set(range(first))
    for word in source:
        chosen.add(word)  # shared vocabulary: the source word itself
        chosen.update(lists[offsets[word] : offsets[word + 1]].tolist())
    return chosen


def test_shortlist_gives_xfs_candidates_and_the_source_words():
    rng = np.random.default_rng(1)
    vocab = 200
    per_source = rng.integers(4, vocab, size=(vocab, 5)).astype(np.int32)
    per_source[:, -1] = 3  # eos padding
    shortlist = Shortlist(rng.choice(np.arange(4, vocab), 12, replace=False).astype(np.int32), per_source, vocab, "d")
    blob = binary_shortlist(shortlist)
    for _ in range(5):
        source = rng.integers(4, vocab, size=7).tolist() + [3]  # Marian's source ends in eos
        # xf's candidates before its padding to a multiple of 64; pad and bos left out (Marian has neither)
        chosen = {1, 3} | set(shortlist.frequent.tolist()) | set(per_source[source[:-1]].ravel().tolist())
        assert chosen <= {int(i) for i in shortlist.candidates(torch.tensor([source]))}
        assert marian_candidates(blob, vocab, source) == chosen | set(source)


@pytest.mark.parametrize("shape, words", [
    (dict(d_model=96, heads=4, d_ff=128), ["d_model 96", "heads x head_dim 96"]),
    (dict(d_model=64, heads=4, d_ff=100), ["d_ff 100"]),
    (dict(d_model=64, heads=4, d_ff=128, vocab_size=1001), ["a vocabulary of 1001"]),
])
def test_widths_the_int8_engine_cannot_take_are_refused(shape, words):
    with pytest.raises(XfError) as e:
        check_int8_shapes(ModelConfig(**shape))
    assert all(w in str(e.value) for w in words) and "\n" not in str(e.value)
    check_int8_shapes(ModelConfig(d_model=64, heads=4, d_ff=128, vocab_size=1000))


def test_a_missing_or_other_engine_names_the_command_that_installs_it(tmp_path):
    with pytest.raises(XfError, match="make bergamot"):
        engine_package(tmp_path / "nowhere")
    (tmp_path / "package.json").write_text(json.dumps({"version": "0.4.8"}))
    with pytest.raises(XfError, match="0.4.8, xf writes for 0.4.9.*make bergamot"):
        engine_package(tmp_path)
    (tmp_path / "package.json").write_text(json.dumps({"version": "0.4.9"}))
    with pytest.raises(XfError, match="lacks translator.js.*make bergamot"):
        engine_package(tmp_path)


def test_a_direction_is_named_by_two_letters_a_three_letter_code_by_its_two():
    """spa-deu was named "spde" (its first two letters); an ISO 639-3 code is its ISO 639-1 one."""
    from xformer_cli.formats.bergamot import direction_name

    assert direction_name("en", "de") == direction_name("eng", "deu") == "ende"
    assert direction_name("spa", "deu") == "esde"
    with pytest.raises(XfError, match="Bergamot names languages by two letters"):
        direction_name("xyz", "de")
