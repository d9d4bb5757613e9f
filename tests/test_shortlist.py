"""The vocabulary shortlist: IBM Model 1 on a hand-made corpus, the candidate set, the file and its
refusals, searches over the candidates (all ids: exactly the full search; a real shortlist: only
candidates), and the command line's bad input."""

from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from xformer_cli.model.checkpoint import make_checkpoint, save_checkpoint, vocab_digest
from xformer_cli.cli import app
from xformer_cli.decode.engines import quantize_int8
from xformer_cli.base.errors import XfError
from xformer_cli.model.transformer import build_model
from xformer_cli.settings.options import DecodingOptions
from xformer_cli.decode.search import DecoderState, beam_search, greedy_search, sample
from xformer_cli.decode.shortlist import ROWS_MULTIPLE, Shortlist, build_shortlist, ibm1_table, most_frequent, top_targets
from xformer_cli.text.vocab import EOS_ID, PAD_ID

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: torch on one thread for the module

runner = CliRunner()

# "the house" / "das Haus", "the book" / "das Buch", "a book" / "ein Buch" (Koehn, SMT, Sec. 4.2):
# EM learns the -> das, house -> Haus, book -> Buch, a -> ein from co-occurrence alone.
THE, HOUSE, BOOK, A = 10, 11, 12, 13
DAS, HAUS, BUCH, EIN = 20, 21, 22, 23
PAIRS = [([THE, HOUSE], [DAS, HAUS]), ([THE, BOOK], [DAS, BUCH]), ([A, BOOK], [EIN, BUCH])]


def corpus():
    return [np.array(s) for s, _ in PAIRS], [np.array(t) for _, t in PAIRS]


def test_ibm1_learns_the_translations_of_a_hand_made_corpus():
    s, t, p = ibm1_table(*corpus(), iterations=10)
    table = {(int(a), int(b)): float(q) for a, b, q in zip(s, t, p)}
    for source in (THE, HOUSE, BOOK, A, -1):  # p(. | s) is a distribution for every source, NULL included
        assert sum(q for (a, _), q in table.items() if a == source) == pytest.approx(1.0)
    best = {source: max((q, b) for (a, b), q in table.items() if a == source)[1] for source in (THE, HOUSE, BOOK, A)}
    assert best == {THE: DAS, HOUSE: HAUS, BOOK: BUCH, A: EIN}
    assert table[(THE, DAS)] > 0.5 and table[(BOOK, BUCH)] > 0.5  # not a near-tie after 10 iterations
    # one iteration from the uniform table: the counts only, "the" co-occurs with das twice
    s1, t1, p1 = ibm1_table(*corpus(), iterations=1)
    first = {(int(a), int(b)): float(q) for a, b, q in zip(s1, t1, p1)}
    # by hand: each target shares 1 among its 3 sources (NULL included), so c(the, das) = 1/3 + 1/3,
    # c(the, Haus) = c(the, Buch) = 1/3 and p(das | the) = (2/3) / (4/3)
    assert (first[(THE, DAS)], first[(THE, HAUS)], first[(THE, BUCH)]) == pytest.approx((0.5, 0.25, 0.25))


def test_top_targets_and_most_frequent_by_hand():
    s = np.array([5, 5, 5, 6, -1])
    t = np.array([7, 8, 9, 7, 8])
    p = np.array([0.2, 0.5, 0.3, 1.0, 1.0])
    table = top_targets(s, t, p, vocab_size=10, k=2)
    assert table[5].tolist() == [8, 9] and table[6].tolist() == [7, EOS_ID]  # padded with eos
    assert table[4].tolist() == [EOS_ID, EOS_ID]  # never seen: nothing but eos
    assert most_frequent([np.array([4, 9, 9]), np.array([7, 9, 4])], 10, 2).tolist() == [9, 4]
    assert most_frequent([np.array([4])], 6, 4).tolist() == [4, 0, 1, 2]  # then the unseen, in id order


def shortlist_of(vocab_size=40, frequent=3, k=2, seed=0):
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, vocab_size, size=rng.integers(1, 8)) for _ in range(50)]
    tgt = [rng.integers(4, vocab_size, size=rng.integers(1, 8)) for _ in range(50)]
    return build_shortlist(src, tgt, vocab_size, "digest", frequent=frequent, k=k, iterations=3)


def test_candidates_are_the_specials_the_frequent_and_the_batch_pieces_top_k():
    shortlist = shortlist_of(vocab_size=300, frequent=10, k=20)
    src = torch.tensor([[5, 9, 5, EOS_ID], [7, EOS_ID, PAD_ID, PAD_ID]])
    vocab = shortlist.candidates(src)
    expected = {0, 1, 2, 3, *shortlist.frequent.tolist()}
    for piece in (5, 9, 7):
        expected |= set(shortlist.per_source[piece].tolist())
    assert vocab.dtype == torch.long and vocab.tolist() == sorted(set(vocab.tolist()))  # sorted, no repeats
    assert len(vocab) == ROWS_MULTIPLE and len(expected) < ROWS_MULTIPLE  # padded to a multiple of 64 rows
    padding = sorted(set(vocab.tolist()) - expected)
    assert expected <= set(vocab.tolist()) and padding == sorted(set(range(300)) - expected)[: len(padding)]
    assert shortlist_of(vocab_size=40).candidates(src).tolist() == list(range(40))  # never beyond the vocabulary


def test_the_file_round_trips_and_another_vocabulary_is_refused(tmp_path):
    shortlist = shortlist_of()
    path = tmp_path / "sl.npz"
    shortlist.save(path)
    loaded = Shortlist.load(path)
    assert np.array_equal(loaded.frequent, shortlist.frequent) and np.array_equal(loaded.per_source, shortlist.per_source)
    assert (loaded.vocab_size, loaded.vocab_digest, loaded.k, loaded.iterations) == (40, "digest", 2, 3)
    loaded.check_vocabulary(path, 40, "digest")
    with pytest.raises(XfError, match=r"sl.npz: shortlist for a vocabulary of 40 pieces, the model has 41"):
        loaded.check_vocabulary(path, 41, "digest")
    with pytest.raises(XfError, match=r"sl.npz: shortlist built with another sentencepiece model"):
        loaded.check_vocabulary(path, 40, "other")


def test_damaged_and_pickled_files_are_refused(tmp_path):
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(XfError, match=r"junk.npz: not a shortlist written by xf shortlist"):
        Shortlist.load(tmp_path / "junk.npz")
    np.savez(tmp_path / "pickled.npz", header=np.array([{"format": "xf-shortlist"}], dtype=object))
    with pytest.raises(XfError, match=r"pickled.npz: not a shortlist"):
        Shortlist.load(tmp_path / "pickled.npz")
    with pytest.raises(XfError, match=r"missing.npz: shortlist file not found"):
        Shortlist.load(tmp_path / "missing.npz")
    shortlist = shortlist_of()
    shortlist.per_source[5, 0] = 99  # outside the vocabulary of 40
    shortlist.save(tmp_path / "bad.npz")
    with pytest.raises(XfError, match=r"bad.npz: damaged shortlist"):
        Shortlist.load(tmp_path / "bad.npz")


def test_a_cut_or_damaged_file_is_one_line_naming_it(tmp_path):
    """A shortlist cut short (a copy interrupted) raised zipfile's BadZipFile, and other damage
    EOFError, zlib.error or numpy's parser errors, none naming the file: every length it can be
    cut to, and every byte flipped, loads or is an XfError naming it."""
    shortlist_of().save(tmp_path / "sl.npz")
    data = (tmp_path / "sl.npz").read_bytes()
    for n in range(len(data)):
        (tmp_path / "cut.npz").write_bytes(data[:n])
        with pytest.raises(XfError, match=r"cut.npz: not a shortlist written by xf shortlist, or a damaged one") as e:
            Shortlist.load(tmp_path / "cut.npz")
        assert "\n" not in str(e.value)
    for i in range(len(data)):
        (tmp_path / "flipped.npz").write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :])
        try:
            Shortlist.load(tmp_path / "flipped.npz")  # a byte the reader never checks (a zip timestamp)
        except XfError as e:
            assert str(e).startswith(f"{tmp_path / 'flipped.npz'}: ") and "\n" not in str(e)


# -- searches over the candidates ----------------------------------------------------------------
def tiny(vocab_size=40, seed=0, **overrides):
    torch.manual_seed(seed)
    model = build_model("tiny", vocab_size=vocab_size, d_model=32, d_ff=64, heads=4, encoder_layers=2,
                        decoder_layers=2, **overrides).eval()
    if model.output_bias is not None:
        model.output_bias.normal_()
    return model


SRC = torch.tensor([[5, 6, 7, 8, EOS_ID], [11, 12, EOS_ID, PAD_ID, PAD_ID], [13, EOS_ID, PAD_ID, PAD_ID, PAD_ID]])


def exactly_equal(a, b):
    for hyps_a, hyps_b in zip(a, b, strict=True):
        assert [(h.tokens, h.score, h.positional_scores) for h in hyps_a] == \
               [(h.tokens, h.score, h.positional_scores) for h in hyps_b]


@pytest.mark.parametrize("output_bias", [False, True])
def test_a_shortlist_of_every_id_is_exactly_the_full_search(output_bias):
    models = [tiny(output_bias=output_bias), tiny(seed=1, output_bias=output_bias)]
    every = torch.arange(40)
    for ensemble in (models[:1], models):
        options = DecodingOptions(beam_size=3, nbest=2, max_len_b=6)
        exactly_equal(beam_search(ensemble, SRC, options), beam_search(ensemble, SRC, options, candidates=every))
        exactly_equal(greedy_search(ensemble, SRC, options), greedy_search(ensemble, SRC, options, candidates=every))
        sampling = DecodingOptions(sampling=True, nbest=2, max_len_b=6)
        exactly_equal(sample(ensemble, SRC, sampling, torch.Generator().manual_seed(3)),
                      sample(ensemble, SRC, sampling, torch.Generator().manual_seed(3), candidates=every))


@pytest.mark.kernels
def test_int8_over_every_id_is_exactly_the_full_int8_search():
    """Exact on every CPU kind by construction: the same int8 rows, scale and shape go to the same
    kernel, so whichever kernel the CPU picks, it picks it for both (tests/test_cpu_kinds.py runs
    this capped at AVX2)."""
    model = quantize_int8(tiny())
    options = DecodingOptions(beam_size=3, max_len_b=6)
    exactly_equal(beam_search([model], SRC, options), beam_search([model], SRC, options, candidates=torch.arange(40)))


def test_a_real_shortlist_emits_only_its_candidates():
    model = tiny()
    vocab = torch.tensor([0, 1, 2, 3, 9, 17, 21, 30])
    options = DecodingOptions(beam_size=4, nbest=4, max_len_b=8)
    for found in (beam_search([model], SRC, options, candidates=vocab), greedy_search([model], SRC, options, candidates=vocab),
                  sample([model], SRC, DecodingOptions(sampling=True, nbest=3, max_len_b=8), torch.Generator().manual_seed(1),
                         candidates=vocab)):
        tokens = [t for hyps in found for h in hyps for t in h.tokens]
        assert tokens and set(tokens) <= set(vocab.tolist()) - {0, 2}
        assert any(t not in (0, 1, 2, 3) for t in tokens)  # ids mapped back, not columns 4-7
        for hyps in found:
            for h in hyps:
                assert h.tokens[-1] == EOS_ID and all(s <= 0 for s in h.positional_scores)
    # the restricted log-probabilities are the full ones renormalized over the candidates
    bos = torch.full((3, 1), 2)
    full = DecoderState([model], SRC).log_probs(bos)
    restricted = DecoderState([model], SRC, vocab=vocab).log_probs(bos)
    assert restricted.shape == (3, len(vocab))
    assert torch.allclose(restricted, full[:, vocab] - full[:, vocab].logsumexp(-1, keepdim=True), atol=1e-5)


# -- the command line ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_and_shortlist(data_dir, tmp_path_factory):
    """A random tiny checkpoint of data_dir's vocabulary and xf shortlist's file for it."""
    from xformer_cli.data.dataset import DataDir

    tmp = tmp_path_factory.mktemp("shortlist")
    data = DataDir.open(data_dir)
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=data.vocab_size, d_model=32, d_ff=64, heads=4, max_positions=128)
    save_checkpoint(tmp / "model.pt", make_checkpoint(model, data.spm_model_bytes))
    result = runner.invoke(app, ["shortlist", str(data_dir), "--output", str(tmp / "sl.npz"), "--frequent", "20",
                                 "--per-source", "5", "--em-iterations", "2"])
    assert result.exit_code == 0, result.output
    assert "xf shortlist" in result.output and "candidates per batch of 64" in result.output
    full = tmp / "all.npz"
    assert runner.invoke(app, ["shortlist", str(data_dir), "--output", str(full), "--frequent",
                               str(data.vocab_size)]).exit_code == 0
    return tmp, data


def translate(tmp, *extra):
    out = tmp / "out.txt"
    out.unlink(missing_ok=True)
    result = runner.invoke(app, ["translate", "--path", str(tmp / "model.pt"), "--input", str(tmp / "in.txt"), "--output",
                                 str(out), "--max-len-b", "5", "--quiet", "--threads", "1", *extra])
    return result, (out.read_bytes() if out.exists() else None)


def test_translate_with_a_shortlist(model_and_shortlist, sentences):
    tmp, data = model_and_shortlist
    (tmp / "in.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    shortlist = Shortlist.load(tmp / "sl.npz")
    assert shortlist.vocab_digest == vocab_digest(data.spm_model_bytes) and shortlist.k == 5
    assert len(shortlist.frequent) == 20
    plain, plain_out = translate(tmp)
    everything, every_out = translate(tmp, "--shortlist", str(tmp / "all.npz"))
    short, short_out = translate(tmp, "--shortlist", str(tmp / "sl.npz"), "--output-format", "jsonl")
    assert plain.exit_code == everything.exit_code == short.exit_code == 0, short.output
    assert every_out == plain_out  # a shortlist of every piece: byte-identical output
    import json

    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=data.spm_model_bytes)
    ids = torch.tensor([i for line in sentences for i in sp.encode(line)])[None]
    allowed = {sp.id_to_piece(i) for i in shortlist.candidates(ids).tolist()}
    emitted = {p for line in short_out.decode().splitlines() for h in json.loads(line)["hypotheses"] for p in h["tokens"]}
    assert emitted and emitted <= allowed and len(allowed) < data.vocab_size


def one_line_error(result, *words):
    lines = result.output.strip().splitlines()
    assert result.exit_code != 0 and len(lines) == 1 and lines[0].startswith("xf: error:"), result.output
    for word in words:
        assert word in lines[0], lines[0]


def test_bad_input_is_one_line_and_writes_nothing(model_and_shortlist, tmp_path, ckpt):
    tmp, data = model_and_shortlist
    out = tmp_path / "sl.npz"
    one_line_error(runner.invoke(app, ["shortlist", str(tmp_path / "nowhere"), "--output", str(out)]), "nowhere")
    one_line_error(runner.invoke(app, ["shortlist", str(data.path), "--output", str(out), "--per-source", "0"]),
                   "--per-source")
    one_line_error(runner.invoke(app, ["shortlist", str(data.path), "--output", str(out), "--em-iterations", "-1"]),
                   "--em-iterations")
    one_line_error(runner.invoke(app, ["shortlist", str(data.path), "--output", str(tmp / "sl.npz")]), "exists")
    one_line_error(runner.invoke(app, ["shortlist", str(data.path), "--output", str(tmp_path / "no" / "sl.npz")]),
                   "directory does not exist")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "in.txt").write_text("a dog\n")
    base = ["translate", "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "out.txt")]
    one_line_error(runner.invoke(app, [*base, "--path", str(tmp / "model.pt"), "--shortlist", str(tmp_path / "x.npz")]),
                   "x.npz", "not found")
    # the conftest checkpoint has another vocabulary (200 pieces of another sentencepiece model)
    one_line_error(runner.invoke(app, [*base, "--path", ckpt, "--shortlist", str(tmp / "sl.npz")]), "sl.npz",
                   "vocabulary")
    (tmp / "cut.npz").write_bytes((tmp / "sl.npz").read_bytes()[:100])  # a copy cut short
    one_line_error(runner.invoke(app, [*base, "--path", ckpt, "--shortlist", str(tmp / "cut.npz")]), "cut.npz",
                   "damaged")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_ctranslate2_takes_the_shortlist_as_its_vocabulary_map(model_and_shortlist, sentences, ckpt, tmp_path):
    pytest.importorskip("ctranslate2")
    tmp, data = model_and_shortlist
    (tmp / "in.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    ct2 = tmp_path / "ct2"
    assert runner.invoke(app, ["export", "ctranslate2", "--path", str(tmp / "model.pt"), "--output", str(ct2)]).exit_code == 0
    before = sorted(p.name for p in ct2.iterdir())
    engine = ["--path", str(ct2), "--engine", "ctranslate2"]
    out = tmp / "out.txt"
    base = ["translate", "--input", str(tmp / "in.txt"), "--output", str(out), "--max-len-b", "5", "--quiet",
            "--output-format", "jsonl", "--threads", "1", *engine]
    results = {}
    for name, extra in (("plain", []), ("all", ["--shortlist", str(tmp / "all.npz")]), ("short", ["--shortlist", str(tmp / "sl.npz")])):
        result = runner.invoke(app, [*base, *extra])
        assert result.exit_code == 0, result.output
        results[name] = out.read_text(encoding="utf-8")
    assert sorted(p.name for p in ct2.iterdir()) == before  # the model directory is left as it was
    import json

    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=data.spm_model_bytes)
    ids = torch.tensor([i for line in sentences for i in sp.encode(line)])[None]
    allowed = {sp.id_to_piece(i) for i in Shortlist.load(tmp / "sl.npz").candidates(ids).tolist()}
    tokens = lambda text: {p for line in text.splitlines() for h in json.loads(line)["hypotheses"] for p in h["tokens"]}
    assert tokens(results["short"]) <= allowed and tokens(results["short"]) != tokens(results["plain"])
    assert results["all"] == results["plain"]
    one_line_error(runner.invoke(app, ["translate", *engine, "--input", str(tmp / "in.txt"), "--shortlist",
                                       str(Path(ckpt).parent / "missing.npz")]), "missing.npz")
