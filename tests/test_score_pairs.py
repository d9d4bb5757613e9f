"""Forced-decoding scores of given pairs (xformer_cli/decode/pair_scoring.py) and xf score-pairs.

The reference is the search itself: a beam search's hypothesis score with lenpen 0 is its summed
log-probability, so scoring (source, that hypothesis) must give it back, for one model and for an
ensemble, batched or one pair at a time.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from xformer_cli.data.batching import collate, collate_source
from xformer_cli.cli import app
from xformer_cli.model.transformer import build_model
from xformer_cli.settings.options import DecodingOptions, ScorePairsOptions
from xformer_cli.decode.pair_scoring import PairScore, dual_conditional_cross_entropy, forced_log_probs, max_length, score_pairs
from xformer_cli.decode.search import beam_search, greedy_search
from helpers import MAX_POSITIONS, tiny_checkpoint

runner = CliRunner()
CLOSE = dict(rtol=1e-5, atol=1e-4)  # incremental (cached) against whole-prefix decoding: float rounding


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return [build_model("tiny", vocab_size=60, d_model=32, d_ff=64, heads=4, max_positions=64).eval()
            for _ in range(2)]


@pytest.fixture(scope="module")
def sources():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(4, 60, (n,), generator=g).tolist() for n in (3, 9, 5, 1, 12, 7)]


def _hypothesis_pairs(models, sources, search=beam_search, **decoding):
    """(sources, targets, the search's scores) of every hypothesis the search returns, lenpen 0."""
    options = DecodingOptions(lenpen=0.0, max_len_b=12, **decoding)
    found = search(models, collate_source(sources), options)
    src, tgt, want = [], [], []
    for s, hyps in zip(sources, found):
        for h in hyps:
            src.append(s)
            tgt.append(h.tokens[:-1])  # without the eos that scoring adds
            want.append((h.score, sum(h.positional_scores), len(h.tokens)))
    return src, tgt, want


@pytest.mark.parametrize("ensemble", [1, 2], ids=["one-model", "ensemble"])
def test_the_sum_is_the_beam_searchs_own_hypothesis_score(models, sources, ensemble):
    src, tgt, want = _hypothesis_pairs(models[:ensemble], sources, beam_size=4, nbest=4)
    got = score_pairs(models[:ensemble], src, tgt, max_sentences=5)
    assert len(got) == len(want) == 4 * len(sources)
    torch.testing.assert_close([p.score for p in got], [w[0] for w in want], **CLOSE)
    assert [p.tokens for p in got] == [w[2] for w in want]  # target subwords + eos


def test_the_sum_is_greedy_searchs_score(models, sources):
    src, tgt, want = _hypothesis_pairs(models[:1], sources, search=greedy_search)
    torch.testing.assert_close([p.score for p in score_pairs(models[:1], src, tgt)], [w[0] for w in want], **CLOSE)


def test_batched_equals_one_by_one(models, sources):
    src, tgt, _ = _hypothesis_pairs(models, sources, beam_size=3, nbest=3)
    batched = score_pairs(models, src, tgt, max_tokens=40)
    alone = [score_pairs(models, [s], [t])[0] for s, t in zip(src, tgt)]
    torch.testing.assert_close([p.score for p in batched], [p.score for p in alone], rtol=1e-6, atol=1e-5)
    assert [p.tokens for p in batched] == [p.tokens for p in alone]


def test_an_ensemble_averages_each_tokens_probability(models, sources):
    batch = collate([(sources[1], sources[2]), (sources[4], sources[0])])
    tensors = batch["src"], batch["prev_output"], batch["target"]
    one, two = (forced_log_probs([m], *tensors) for m in models)
    both = forced_log_probs(models, *tensors)
    real = batch["target"].ne(0)
    mean_probability = ((one.exp() + two.exp()) / 2).log()  # not the mean of the log-probabilities
    torch.testing.assert_close(both[real], mean_probability[real], rtol=1e-5, atol=1e-5)
    assert both[~real].eq(0).all()  # padding adds nothing to a sum


def test_an_empty_target_is_eos_alone(models, sources):
    p = score_pairs(models[:1], [sources[0]], [[]])[0]
    assert p.tokens == 1 and p.mean == p.score < 0


def test_a_side_over_the_models_positions_is_refused(models):
    limit = max_length(models)
    assert limit == 63
    score_pairs(models, [[5] * limit], [[5] * limit])
    with pytest.raises(ValueError, match="longer than"):
        score_pairs(models, [[5]], [[5] * (limit + 1)])


def test_the_dual_score_by_hand():
    # H_fwd 2, H_rev 3: |2 - 3| + (2 + 3) / 2 = 3.5; agreeing models pay only the mean
    assert dual_conditional_cross_entropy(2.0, 3.0) == 3.5
    assert dual_conditional_cross_entropy(3.0, 2.0) == 3.5
    assert dual_conditional_cross_entropy(1.5, 1.5) == 1.5
    assert PairScore(-6.0, 3).mean == -2.0


# -- the command ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def files(spm_model, tmp_path_factory, multi30k_dir):
    root = tmp_path_factory.mktemp("pairs")
    forward = tiny_checkpoint(root / "fwd.pt", spm_model, seed=0)
    reverse = tiny_checkpoint(root / "rev.pt", spm_model, seed=1)
    en = (multi30k_dir / "test2016.en").read_text(encoding="utf-8").splitlines()[:9]
    de = (multi30k_dir / "test2016.de").read_text(encoding="utf-8").splitlines()[:9]
    en[4], de[6] = "", "   "  # empty lines are scored as the empty sentence
    (root / "src.en").write_text("\n".join(en) + "\n", encoding="utf-8")
    (root / "tgt.de").write_text("\n".join(de) + "\n", encoding="utf-8")
    return root, forward, reverse


def _run(*args):
    result = runner.invoke(app, ["score-pairs", "--device", "cpu", "--quiet", *map(str, args)])
    return result


def _records(result):
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_the_command_writes_one_record_per_pair_in_input_order(files):
    root, forward, reverse = files
    records = _records(_run("--path", forward, "--source", root / "src.en", "--target", root / "tgt.de",
                            "--batch-size", "2", "--buffer-size", "4"))
    assert [r["line"] for r in records] == list(range(1, 10))
    assert records[6]["tokens"] == 1  # the whitespace-only target: eos alone
    alone = _records(_run("--path", forward, "--source", root / "src.en", "--target", root / "tgt.de",
                          "--batch-size", "1"))
    for a, b in zip(records, alone):
        assert a["tokens"] == b["tokens"] and a["score"] == pytest.approx(b["score"], abs=1e-4)
        assert a["mean"] == pytest.approx(a["score"] / a["tokens"], abs=1e-5)


def test_the_reverse_direction_is_the_swapped_files_under_the_reverse_model(files):
    root, forward, reverse = files
    both = _records(_run("--path", forward, "--reverse-path", reverse, "--source", root / "src.en",
                         "--target", root / "tgt.de"))
    swapped = _records(_run("--path", reverse, "--source", root / "tgt.de", "--target", root / "src.en"))
    for b, s in zip(both, swapped):
        assert b["reverse_tokens"] == s["tokens"]
        assert b["reverse_score"] == pytest.approx(s["score"], abs=1e-4)
        assert b["h_forward"] == pytest.approx(-b["mean"], abs=1e-6)
        h_f, h_r = -b["score"] / b["tokens"], -b["reverse_score"] / b["reverse_tokens"]
        assert b["dual"] == pytest.approx(abs(h_f - h_r) + (h_f + h_r) / 2, abs=1e-5)


def test_text_output_is_one_number_a_line(files, tmp_path):
    root, forward, reverse = files
    pairs = ("--source", root / "src.en", "--target", root / "tgt.de")
    records = _records(_run("--path", forward, *pairs))
    for normalize, key in (("mean", "mean"), ("sum", "score")):
        out = tmp_path / f"{normalize}.txt"
        result = _run("--path", forward, *pairs, "--output-format", "text", "--normalize", normalize, "--output", out)
        assert result.exit_code == 0, result.output
        numbers = [float(x) for x in out.read_text().splitlines()]
        assert numbers == pytest.approx([r[key] for r in records], abs=1e-5)
    dual = _records(_run("--path", forward, "--reverse-path", reverse, *pairs))
    result = _run("--path", forward, "--reverse-path", reverse, *pairs, "--output-format", "text")
    assert [float(x) for x in result.stdout.split()] == pytest.approx([r["dual"] for r in dual], abs=1e-5)
    result = _run("--path", forward, "--reverse-path", reverse, *pairs, "--output-format", "text", "--normalize", "sum")
    assert result.exit_code == 2 and "--normalize sum" in result.output


def test_unequal_line_counts_are_one_line_naming_the_files(files, tmp_path):
    root, forward, _ = files
    short = tmp_path / "short.de"
    short.write_text("ein Hund\nzwei Hunde")  # 2 lines, the last without LF
    result = _run("--path", forward, "--source", root / "src.en", "--target", short, "--output", tmp_path / "o")
    lines = result.output.strip().splitlines()
    assert result.exit_code != 0 and len(lines) == 1
    assert lines[0].startswith("xf: error: ") and str(short) in lines[0] and "2 lines" in lines[0] and "9" in lines[0]
    assert not (tmp_path / "o").exists()


def test_a_line_over_the_models_positions_names_its_file_and_line(files, tmp_path):
    root, forward, _ = files
    src, tgt = tmp_path / "s.en", tmp_path / "t.de"
    src.write_text("a dog\na cat\n")
    tgt.write_text("ein Hund\n" + " ".join(["Katze"] * MAX_POSITIONS) + "\n")
    result = _run("--path", forward, "--source", src, "--target", tgt, "--output", tmp_path / "o")
    lines = result.output.strip().splitlines()
    assert result.exit_code != 0 and len(lines) == 1, result.output
    assert f"{tgt}:2:" in lines[0] and "does not cut" in lines[0]
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_options_check_their_ranges():
    with pytest.raises(ValueError, match="max_tokens|max-tokens"):
        ScorePairsOptions(path=("m.pt",), source="s", target="t", max_tokens=-1)
