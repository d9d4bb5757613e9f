"""Recorded attention is the model's own; hard alignments are the argmax of the averaged
cross-attention; xf translate --print-alignment formats them. Tiny models, fixed seeds."""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner


from xformer_cli.model import transformer as model_module
from xformer_cli.model.attention_maps import (
    AttentionMaps,
    alignment_pairs,
    degeneracies,
    force_decode,
    format_alignment,
    hard_alignments,
    record,
    resolve_layer,
    target_batch,
    word_ids,
)
from xformer_cli.cli import app
from xformer_cli.base.errors import ConfigError
from xformer_cli.model.transformer import build_model
from xformer_cli.text.vocab import PAD_ID, EOS_ID
from xformer_cli.settings.options import TranslateOptions
from xformer_cli.decode.search import Hypothesis, beam_search
from xformer_cli.data.batching import collate_source
from xformer_cli.settings.options import DecodingOptions
from xformer_cli.model.checkpoint import load_ensemble
from xformer_cli.decode.translate import Stats, translate_buffer
from xformer_cli.decode.engines import XfEngine

V = 40
runner = CliRunner()


def tiny(seed=0, **overrides):
    torch.manual_seed(seed)
    return build_model("tiny", vocab_size=V, dropout=0.0, **overrides).eval()


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (3, 7), generator=g)
    src[:, -1] = EOS_ID
    src[1, 4], src[1, 5:] = EOS_ID, PAD_ID  # a shorter sentence, right-padded
    targets = [[5, 6, 7, 8, EOS_ID], [9, EOS_ID], [10, 11, 12, EOS_ID]]
    return src, targets


def attention_modules(model):
    """Every attention module in the order a forward pass calls them."""
    modules = [layer.self_attn for layer in model.encoder_layers]
    for layer in model.decoder_layers:
        modules += [layer.self_attn, layer.cross_attn]
    return modules


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [{}, {"normalize_before": True}, {"positions": "alibi"}, {"positions": "rope"},
                                       {"head_dim": 8}])
def test_recorded_weights_are_those_of_the_forward_pass(monkeypatch, overrides):
    model = tiny(**overrides)
    src, targets = batch()
    prev = target_batch(targets, src.device)
    seen = []  # what attention() itself computes in a normal forward pass (CPU, short: explicit path)
    real = model_module.attention_weights

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(model_module, "attention_weights", spy)
    with torch.no_grad():
        logits = model(src, prev)
    monkeypatch.undo()
    modules = attention_modules(model)
    assert len(seen) == len(modules)
    with torch.no_grad(), record(modules) as calls:
        recorded_logits = model(src, prev)
    assert torch.equal(recorded_logits, logits)  # recording changes nothing
    for weights, (recorded,) in zip(seen, calls):
        assert torch.equal(recorded, weights)
    assert all(m.recorded is None for m in modules)  # recording is off again


@pytest.mark.slow
def test_rows_sum_to_one_and_padding_gets_nothing():
    model = tiny()
    src, targets = batch()
    maps = force_decode(model, src, targets)
    assert len(maps.encoder) == len(maps.decoder) == len(maps.cross) == 2
    for weights in maps.encoder + maps.decoder + maps.cross:
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    for weights in maps.encoder + maps.cross:
        assert weights[1, :, :, 5:].abs().max() < 1e-6  # sentence 1's padded source positions
    decoder = maps.decoder[0]
    assert torch.equal(decoder.triu(1), torch.zeros_like(decoder))  # causal: no future keys


def test_long_sequences_record_the_same_attention_as_sdpa():
    # Past MATMUL_ATTENTION_MAX_POSITIONS the normal path is SDPA; recording takes the explicit
    # path, whose output must be the same.
    model = tiny(max_positions=128)
    g = torch.Generator().manual_seed(2)
    src = torch.randint(4, V, (2, 80), generator=g)
    targets = [torch.randint(4, V, (70,), generator=g).tolist() + [EOS_ID]] * 2
    prev = target_batch(targets, src.device)
    with torch.no_grad():
        logits = model(src, prev)
        with record(attention_modules(model)):
            recorded = model(src, prev)
    torch.testing.assert_close(recorded, logits, rtol=1e-5, atol=1e-5)


def test_recording_needs_eval_mode_and_stops_on_errors():
    model = tiny()
    with pytest.raises(ValueError, match="eval mode"):
        with record([model.decoder_layers[0].cross_attn.train()]):
            pass
    model.eval()
    module = model.decoder_layers[0].cross_attn
    with pytest.raises(RuntimeError):
        with record([module]):
            raise RuntimeError("boom")
    assert module.recorded is None


def test_resolve_layer_defaults_to_the_penultimate():
    assert resolve_layer(None, 6) == 4 and resolve_layer(None, 2) == 0 and resolve_layer(None, 1) == 0
    assert resolve_layer(1, 6) == 0 and resolve_layer(6, 6) == 5 and resolve_layer(-1, 6) == 5
    for bad in (0, 7, -7):
        with pytest.raises(ConfigError, match="the model has 6 decoder layers"):
            resolve_layer(bad, 6)


@pytest.mark.parametrize("layer", [None, 1, -1])
def test_alignment_is_the_argmax_of_the_head_averaged_cross_attention(layer):
    models = [tiny(seed=0), tiny(seed=1)]
    src, targets = batch()
    hyps = [[Hypothesis(targets[0], 0.0, []), Hypothesis(targets[2], 0.0, [])], [Hypothesis(targets[1], 0.0, [])], []]
    got = hard_alignments(models, src, hyps, layer)

    index = resolve_layer(layer, 2)
    for i, sentence_hyps in enumerate(hyps):
        assert len(got[i]) == len(sentence_hyps)
        for h, alignment in zip(sentence_hyps, got[i]):
            one = src[i : i + 1]
            mean = sum(force_decode(m, one, [h.tokens]).cross[index][0].mean(0) for m in models) / 2  # (T, S)
            valid = one[0].ne(PAD_ID) & one[0].ne(EOS_ID)
            expected = mean[:, valid].argmax(-1)[:-1].tolist()  # eos excluded on both sides
            assert alignment == expected
            assert len(alignment) == len(h.tokens) - 1


def test_word_alignment():
    assert word_ids(["\u2581Ein", "\u2581Hu", "nd", "."]) == [0, 1, 1, 1]
    assert word_ids(["ab", "\u2581c", "\u2581", "d"]) == [0, 1, 2, 2]
    src = ["\u2581A", "\u2581do", "g", "\u2581runs", "."]  # A dog runs.
    tgt = ["\u2581Ein", "\u2581Hu", "nd", "\u2581rennt", "."]  # Ein Hund rennt.
    alignment = [0, 2, 1, 3, 4]
    assert alignment_pairs(alignment) == [(0, 0), (2, 1), (1, 2), (3, 3), (4, 4)]
    assert alignment_pairs(alignment, word_ids(src), word_ids(tgt)) == [(0, 0), (1, 1), (2, 2)]


def test_source_words_are_those_of_the_line_as_given(spm_model):
    """Regression: 'A\u200bdog\u200bruns.' is one whitespace-separated word, though
    sentencepiece's normalization makes the zero-width spaces into word boundaries (▁)."""
    from xformer_cli.model.attention_maps import line_word_ids
    from xformer_cli.text.vocab import load_sentencepiece

    sp = load_sentencepiece(spm_model)
    for line, words in (("A\u200bdog\u200bruns.", 1), ("A  dog ｒｕｎｓ.", 3), ("  two words ", 2), ("Ein Hund", 2)):
        ids = line_word_ids(sp, line)
        assert len(ids) == len(sp.encode(line)) and ids == sorted(ids), (line, ids)
        assert set(ids) == set(range(words)), (line, ids)  # every word has a subword, none past the last
    assert word_ids([sp.id_to_piece(t) for t in sp.encode("A\u200bdog\u200bruns.")])[-1] > 0  # what was counted
    assert line_word_ids(sp, "   ") == []
    assert format_alignment([(0, 0), (2, 1)]) == "0-0 2-1"


# -- xf translate --print-alignment ------------------------------------------------------------
def translate_lines(ckpt, lines, **overrides):
    models, sp = load_ensemble([ckpt], torch.device("cpu"))
    options = TranslateOptions(path=(ckpt,), **{"max_len_a": 0.5, "max_len_b": 4, "beam_size": 3, **overrides})
    return "".join(translate_buffer(XfEngine(models, torch.device("cpu")), sp, lines, 0, options, Stats()))


@pytest.mark.slow
def test_print_alignment_formats(ckpt, sentences):
    lines = [sentences[0], "", sentences[1]]
    plain = translate_lines(ckpt, lines).splitlines()
    text = translate_lines(ckpt, lines, print_alignment=True).splitlines()
    assert [line.split(" ||| ")[0] for line in text] == plain  # the translations are unchanged
    assert text[1] == " ||| "

    models, sp = load_ensemble([ckpt], torch.device("cpu"))
    for line, out in zip((sentences[0], sentences[1]), (text[0], text[2])):
        pieces = sp.encode(line, out_type=int)
        src = collate_source([pieces])
        hyp = beam_search(models, src, DecodingOptions(beam_size=3, max_len_a=0.5, max_len_b=4))[0][0]
        (alignment,), = hard_alignments(models, src, [[hyp]])
        assert out.split(" ||| ")[1] == " ".join(f"{s}-{t}" for t, s in enumerate(alignment))
        assert all(0 <= s < len(pieces) for s in alignment) and len(alignment) == len(hyp.tokens) - 1

    nbest = translate_lines(ckpt, lines, print_alignment=True, nbest=2).splitlines()
    assert len(nbest) == 6 and all(len(line.split(" ||| ")) == 4 for line in nbest)
    assert nbest[0].split(" ||| ")[3] == text[0].split(" ||| ")[1]

    records = [json.loads(r) for r in translate_lines(ckpt, lines, print_alignment=True, output_format="jsonl",
                                                       nbest=2).splitlines()]
    for rec, n_best_lines in zip((records[0], records[2]), (nbest[0:2], nbest[4:6])):
        for h, line in zip(rec["hypotheses"], n_best_lines):
            assert format_alignment(h["alignment"]) == line.split(" ||| ")[3]
            assert [t for _, t in h["alignment"]] == list(range(len(h["tokens"]) - 1))
    assert records[1]["hypotheses"][0]["alignment"] == []

    words = translate_lines(ckpt, lines, print_alignment=True, alignment_level="word").splitlines()
    for out, line in zip((words[0], words[2]), (sentences[0], sentences[1])):
        translation, links = out.split(" ||| ")
        pairs = [tuple(map(int, p.split("-"))) for p in links.split()]
        assert pairs == sorted(set(pairs))
        assert all(0 <= s < len(line.split()) and 0 <= t < len(translation.split()) for s, t in pairs)
    one_word = translate_lines(ckpt, ["A\u200bdog\u200bruns."], print_alignment=True, alignment_level="word")
    assert {int(p.split("-")[0]) for p in one_word.split(" ||| ")[1].split()} == {0}  # one word in the line


@pytest.mark.slow
def test_print_alignment_through_the_cli(ckpt, sentences):
    result = runner.invoke(app, ["translate", "--path", ckpt, "--max-len-b", "3", "--quiet", "--print-alignment",
                                 "--alignment-layer", "2"], input=(sentences[0] + "\n").encode())
    assert result.exit_code == 0, result.output
    assert result.stdout.count(" ||| ") == 1
    result = runner.invoke(app, ["translate", "--path", ckpt, "--quiet", "--print-alignment",
                                 "--alignment-layer", "3"], input=b"a dog\n")
    assert result.exit_code == 2 and "--alignment-layer 3: the model has 2 decoder layers" in result.output


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_recording_on_cuda_matches_sdpa():
    # On CUDA the normal path is always SDPA; the recording path must give the same output.
    model = tiny().cuda()
    src, targets = batch()
    src = src.cuda()
    prev = target_batch(targets, src.device)
    with torch.no_grad():
        logits = model(src, prev)
        with record(attention_modules(model)) as calls:
            recorded = model(src, prev)
    torch.testing.assert_close(recorded, logits, rtol=1e-4, atol=1e-4)
    for (weights,) in calls:
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1], device="cuda"))


# -- the mechanism check: a trained model's attention is not degenerate ------------------------
def trained_tiny(multi30k_dir, updates=250, seed=1, batch_size=32):
    """`tiny` trained briefly on Multi30k pairs (real, or tests/testdata.py's), with its
    sentencepiece model: 250 updates of 32 pairs, label-smoothed, Adam at 3e-3."""
    import sentencepiece as spm

    from helpers import learn_spm
    from xformer_cli.data.batching import collate
    from xformer_cli.train.loss import label_smoothed_loss

    en = (multi30k_dir / "train.en").read_text(encoding="utf-8").splitlines()[:2000]
    de = (multi30k_dir / "train.de").read_text(encoding="utf-8").splitlines()[:2000]
    sp = spm.SentencePieceProcessor(model_proto=learn_spm(en[:1000] + de[:1000], vocab_size=400))
    pairs = [(np.array(sp.encode(a)), np.array(sp.encode(b))) for a, b in zip(en, de)]
    torch.manual_seed(seed)
    model = build_model("tiny", vocab_size=400, max_positions=128)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    g = torch.Generator().manual_seed(seed)
    for _ in range(updates):
        batch = collate([pairs[i] for i in torch.randint(len(pairs), (batch_size,), generator=g).tolist()])
        logits = model(batch["src"], batch["prev_output"])
        loss, _ = label_smoothed_loss(logits, batch["target"], 0.1)
        optimizer.zero_grad()
        (loss / batch["ntokens"]).backward()
        optimizer.step()
    return model.eval(), sp, pairs


def held_out_maps(model, sp, multi30k_dir):
    """force_decode of 16 val pairs (batched: padding on both sides)."""
    en = (multi30k_dir / "val.en").read_text(encoding="utf-8").splitlines()[:16]
    de = (multi30k_dir / "val.de").read_text(encoding="utf-8").splitlines()[:16]
    src = collate_source([sp.encode(line) for line in en])
    targets = [sp.encode(line) + [EOS_ID] for line in de]
    return force_decode(model, src, targets), src, targets


@pytest.mark.slow
def test_trained_attention_is_not_degenerate_and_random_attention_is(multi30k_dir, one_thread):
    model, sp, _ = trained_tiny(multi30k_dir)
    maps, src, targets = held_out_maps(model, sp, multi30k_dir)
    assert src.eq(PAD_ID).any() and len({len(t) for t in targets}) > 1  # padding is in play
    assert degeneracies(maps, src, targets) == []
    decoder = maps.decoder[0]
    assert torch.equal(decoder.triu(1), torch.zeros_like(decoder))  # exactly zero on the future

    torch.manual_seed(1)
    untrained = build_model("tiny", vocab_size=400, max_positions=128).eval()
    problems = degeneracies(force_decode(untrained, src, targets), src, targets)
    # at initialisation every kind is near-uniform, and that is all that is wrong
    assert [p.split(":")[0] for p in problems] == ["encoder", "decoder", "cross"], problems
    assert all(": near-uniform, mean entropy 0.9" in p for p in problems), problems


def test_degeneracies_names_what_is_wrong():
    """Hand-made maps: uniform, one-hot, the same cross map for every row, weight on padding."""
    src = torch.tensor([[5, 6, 7, EOS_ID], [5, EOS_ID, PAD_ID, PAD_ID]])
    targets = [[8, 9, EOS_ID], [8, EOS_ID]]
    s, t = 4, 3
    peaked = torch.tensor([0.85, 0.05, 0.05, 0.05])

    def rows(fn, n):  # (B=2, H=1, n, s or t)
        return torch.stack([torch.stack([fn(b, i) for i in range(n)]) for b in range(2)])[:, None]

    def over(keys, k):  # a peaked distribution over the first k keys, rolled by position
        return lambda b, i: torch.nn.functional.pad(torch.roll(peaked[:k] / peaked[:k].sum(), i), (0, keys - k))

    src_len, tgt_len = [4, 2], [3, 2]
    healthy = AttentionMaps(
        encoder=[rows(lambda b, i: over(s, src_len[b])(b, i), s)],
        decoder=[rows(lambda b, i: over(t, min(i + 1, tgt_len[b]))(b, i) if i else torch.eye(t)[0], t)],
        cross=[rows(lambda b, i: over(s, src_len[b])(b, i), t)],
    )
    assert degeneracies(healthy, src, targets) == []
    uniform = AttentionMaps(healthy.encoder, healthy.decoder, [rows(lambda b, i: over(s, src_len[b])(b, 0) * 0 + torch.tensor(
        [1 / src_len[b]] * src_len[b] + [0.0] * (s - src_len[b])), t)])
    problems = degeneracies(uniform, src, targets)
    assert problems == ["cross layer 1 head 1: the same map for every target position",
                        "cross: near-uniform, mean entropy 1.00 x log n (heads 1.00-1.00)"]
    collapsed = AttentionMaps([rows(lambda b, i: torch.eye(s)[i], s)], healthy.decoder, healthy.cross)
    assert degeneracies(collapsed, src, targets) == ["encoder layer 1 head 1: collapsed, every row on one position"]
    future = AttentionMaps(healthy.encoder, [rows(lambda b, i: torch.tensor([0.9, 0.1, 0.0]), t)], healthy.cross)
    assert "decoder layer 1 head 1: weight on future positions" in degeneracies(future, src, targets)
    padded = AttentionMaps([rows(lambda b, i: torch.full((s,), 0.25), s)], healthy.decoder, healthy.cross)
    assert "encoder layer 1 head 1: weight on padding" in degeneracies(padded, src, targets)
