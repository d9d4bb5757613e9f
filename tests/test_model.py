"""Model invariants on tiny dimensions with fixed seeds."""

import math

import pytest
import torch

from xformer_cli import build_model
from xformer_cli.model.transformer import PRESETS, DecoderCache, Dropout, attention, model_config, sinusoidal_positions, Transformer
from xformer_cli.text.vocab import PAD_ID

V = 40


def tiny(**overrides) -> Transformer:
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=V, dropout=0.0, **overrides)
    return model.eval()


def batch(b=3, s=7, t=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, V, (b, s), generator=g), torch.randint(4, V, (b, t), generator=g)


VARIANTS = [
    {},
    {"normalize_before": True},
    {"activation": "gelu"},
    {"activation": "swiglu"},
    {"positions": "learned"},
    {"positions": "rope"},
    {"positions": "alibi"},
    {"share_embeddings": "decoder"},
    {"share_embeddings": "none"},
    {"head_dim": 8},  # Table 3 row B: smaller heads, h * d_k = 32 < d_model = 64
    {"heads": 3, "head_dim": 24},  # h * d_k = 72: neither d_model nor a divisor of it
    {"positions": "rope", "head_dim": 8},
]


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: "-".join(map(str, o.values())) or "paper")
def test_decoder_is_causal(overrides):
    model = tiny(**overrides)
    src, tgt = batch()
    out = model(src, tgt)
    changed = tgt.clone()
    changed[:, 4:] = torch.randint(4, V, changed[:, 4:].shape)
    out2 = model(src, changed)
    torch.testing.assert_close(out[:, :4], out2[:, :4], rtol=0, atol=1e-5)
    assert not torch.allclose(out[:, 4:], out2[:, 4:])


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: "-".join(map(str, o.values())) or "paper")
def test_padding_does_not_change_real_positions(overrides):
    model = tiny(**overrides)
    src, tgt = batch()
    out = model(src, tgt)
    pad_src = torch.cat([src, torch.full((3, 5), PAD_ID)], dim=1)
    pad_tgt = torch.cat([tgt, torch.full((3, 4), PAD_ID)], dim=1)
    out2 = model(pad_src, pad_tgt)
    torch.testing.assert_close(out, out2[:, : tgt.size(1)], rtol=0, atol=1e-5)


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: "-".join(map(str, o.values())) or "paper")
def test_incremental_decoding_equals_full_forward(overrides):
    model = tiny(**overrides)
    src, tgt = batch()
    full = model(src, tgt)
    memory, src_pad = model.encode(src)
    cache = model.new_cache()
    steps = [model.decode(tgt[:, i : i + 1], memory, src_pad, cache) for i in range(tgt.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


def test_cache_reorder_follows_rows():
    model = tiny()
    src, tgt = batch()
    memory, src_pad = model.encode(src)
    cache = model.new_cache()
    for i in range(3):
        model.decode(tgt[:, i : i + 1], memory, src_pad, cache)
    order = torch.tensor([2, 0])
    cache.select_rows(order)
    step = model.decode(tgt[order, 3:4], memory[order], src_pad[order], cache)
    full = model(src[order], tgt[order, :4])
    torch.testing.assert_close(step[:, 0], full[:, 3], rtol=0, atol=1e-5)


def test_preallocated_cache_follows_repeated_reorders_and_grows():
    """Same-size reorders gather into the spare buffer (and swap), a capacity of 2 grows while
    decoding 6 steps; every step equals the full forward of the prefix each row now holds."""
    model = tiny()
    src, tgt = batch()
    memory, src_pad = model.encode(src)
    cache = model.new_cache(capacity=2)
    prefixes = tgt[:, :1]
    rows_of_src = torch.arange(src.size(0))
    orders = [None, torch.tensor([2, 0, 1]), torch.tensor([1, 1, 0]), None, torch.tensor([0, 2, 2]), torch.tensor([2, 1, 0])]
    for i, order in enumerate(orders):
        if order is not None:
            cache.select_rows(order)
            prefixes, rows_of_src = prefixes[order], rows_of_src[order]
        step = model.decode(prefixes[:, -1:], memory[rows_of_src], src_pad[rows_of_src], cache)
        full = model(src[rows_of_src], prefixes)
        torch.testing.assert_close(step[:, 0], full[:, -1], rtol=0, atol=1e-5)
        prefixes = torch.cat([prefixes, tgt[rows_of_src, i + 1 : i + 2]], dim=1)
    assert cache.self_attn[0].k.size(0) >= len(orders) > 2


def test_cache_rows_dropped_and_grown_reuse_two_storages():
    """select into fewer rows (done sentences dropped) gathers into the spare's storage, and the
    old buffers become the spare: a search shrinking its batch allocates nothing; more rows than
    the spare holds get a new one. Every select keeps exactly the rows asked for."""
    from xformer_cli.model.transformer import KeyValueCache

    cache = KeyValueCache(capacity=4)
    k = torch.arange(6 * 2 * 3, dtype=torch.float32).view(6, 2, 1, 3)  # (N, H, T, K): 6 rows, one position
    cache.append(k, -k)
    cache.select(torch.arange(6))  # same rows: the spare is made
    storages = {cache.k.untyped_storage().data_ptr(), cache._spare[0].untyped_storage().data_ptr()}
    expected = k
    for rows in (torch.tensor([5, 0, 3, 3]), torch.tensor([2, 0]), torch.tensor([1, 1, 0])):
        cache.select(rows)
        expected = expected[rows]
        assert cache.k.untyped_storage().data_ptr() in storages  # no new storage
        torch.testing.assert_close(cache.k[:1].permute(1, 2, 0, 3), expected, rtol=0, atol=0)
        torch.testing.assert_close(cache.v[:1].permute(1, 2, 0, 3), -expected, rtol=0, atol=0)
    cache.select(torch.arange(3).repeat(4))  # 12 rows: more than either storage holds
    assert cache.k.untyped_storage().data_ptr() not in storages
    torch.testing.assert_close(cache.k[:1].permute(1, 2, 0, 3), expected.repeat(4, 1, 1, 1), rtol=0, atol=0)


def hand_made_cache(rows: int = 3, sentences: int = 3, t: int = 2) -> tuple[DecoderCache, torch.Tensor, torch.Tensor]:
    """A two-layer DecoderCache of ``rows`` prefixes of t positions and ``sentences`` memories,
    every element naming its row (or sentence): row r's keys are r + 0.1 * position, its values
    their negatives, layer 1 the same plus 100; the memory keys of sentence b are 10 b + 0.5."""
    cache = DecoderCache(2)
    prefix = (torch.arange(rows)[:, None] + 0.1 * torch.arange(t)).view(rows, 1, t, 1).expand(rows, 2, t, 3)  # (N, H, t, K)
    memory = (10.0 * torch.arange(sentences) + 0.5).view(sentences, 1, 1, 1).expand(sentences, 2, 4, 3)  # (B, H, S, K)
    for i, layer in enumerate(cache.self_attn):
        layer.append(prefix + 100 * i, -(prefix + 100 * i))
        cache.cross[i] = (memory + 100 * i, -(memory + 100 * i))
    return cache, prefix, memory


def prefixes(cache: DecoderCache, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer i's filled prefix as (N, H, t, K) keys and values."""
    layer = cache.self_attn[i]
    return layer.k[: layer.length].permute(1, 2, 0, 3), layer.v[: layer.length].permute(1, 2, 0, 3)


def test_decoder_cache_select_rows_keeps_prefixes_and_memory_of_the_rows():
    cache, prefix, memory = hand_made_cache()
    rows = torch.tensor([2, 0, 0])  # drop row 1, copy row 0
    cache.select_rows(rows)
    for i in range(2):
        k, v = prefixes(cache, i)
        assert torch.equal(k, prefix[rows] + 100 * i) and torch.equal(v, -(prefix[rows] + 100 * i))
        assert torch.equal(cache.cross[i][0], memory[rows] + 100 * i)
        assert torch.equal(cache.cross[i][1], -(memory[rows] + 100 * i))
    assert cache.length == 2
    cache.select_rows(torch.tensor([1]))  # a size change: new buffers, one row
    assert torch.equal(prefixes(cache, 0)[0], prefix[[0]]) and torch.equal(cache.cross[0][0], memory[[0]])


def test_decoder_cache_follow_beams_moves_prefixes_only():
    """Two sentences of two beams: row r continues row rows[r]'s prefix; the memory stays one
    per sentence (the very tensors: nothing copied)."""
    cache, prefix, memory = hand_made_cache(rows=4, sentences=2)
    cross = list(cache.cross)
    for rows in (torch.tensor([1, 1, 3, 2]), torch.tensor([0, 1, 2, 2])):  # same size: the spare buffer
        cache.follow_beams(rows)
        prefix = prefix[rows]
        for i in range(2):
            k, v = prefixes(cache, i)
            assert torch.equal(k, prefix + 100 * i) and torch.equal(v, -(prefix + 100 * i))
    assert all(a is b for a, b in zip(cache.cross, cross))
    assert torch.equal(prefix[:, 0, 0, 0], torch.tensor([1.0, 1.0, 3.0, 3.0]))  # the composition, by hand


def test_decoder_cache_keep_sentences_drops_a_sentence_and_its_beams():
    cache, prefix, memory = hand_made_cache(rows=6, sentences=3)  # 3 sentences of 2 beams
    cache.keep_sentences(torch.tensor([0, 2]), torch.tensor([0, 1, 4, 5]))
    for i in range(2):
        assert torch.equal(prefixes(cache, i)[0], prefix[[0, 1, 4, 5]] + 100 * i)
        assert torch.equal(cache.cross[i][0], memory[[0, 2]] + 100 * i)
        assert torch.equal(cache.cross[i][1], -(memory[[0, 2]] + 100 * i))


def test_decoder_cache_as_tensors_and_back():
    """The compiled step's view: tensors() gives the very buffers (cross made contiguous), of()
    rebuilds a cache over them, advance() counts the position a step wrote into them."""
    cache, _, _ = hand_made_cache()
    keys, values, cross_keys, cross_values = cache.tensors()
    assert keys[1] is cache.self_attn[1].k and values[0] is cache.self_attn[0].v
    assert all(t.is_contiguous() for t in cross_keys + cross_values) and cross_keys[1] is cache.cross[1][0]
    inner = DecoderCache.of(keys, values, cross_keys, cross_values, cache.length)
    assert inner.length == 2 and inner.self_attn[0].k is keys[0] and inner.cross[1][1] is cross_values[1]
    cache.advance()
    assert [layer.length for layer in cache.self_attn] == [3, 3]


def test_cached_beam_decoding_equals_full_decoding():
    """Beam-shaped decoding through the cache: one row per sentence at the first step, then two
    beams each (follow_beams: the memory stays one per sentence, grouped cross-attention), beams
    reordered, a sentence dropped (keep_sentences); every step equals the full forward of the
    prefix each row holds, against the memory of its sentence."""
    model = tiny()
    src, tgt = batch()
    memory, src_pad = model.encode(src)
    cache = model.new_cache()
    sent_of_row, prefix, g = torch.arange(3), tgt[:, :1], torch.Generator().manual_seed(2)

    def step_equals_full() -> None:
        step = model.decode(prefix[:, -1:], memory, src_pad, cache)
        torch.testing.assert_close(step[:, 0], model(src[sent_of_row], prefix)[:, -1], rtol=0, atol=1e-5)

    step_equals_full()
    for rows in [torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([1, 0, 2, 2, 5, 4]), None]:
        if rows is None:  # sentence 1 is done: keep sentences 0 and 2 and their beams
            sentences, rows = torch.tensor([0, 2]), torch.tensor([0, 1, 4, 5])
            cache.keep_sentences(sentences, rows)
            memory, src_pad = memory[sentences], src_pad[sentences]
        else:
            cache.follow_beams(rows)
        sent_of_row, prefix = sent_of_row[rows], prefix[rows]
        prefix = torch.cat([prefix, torch.randint(4, V, (len(rows), 1), generator=g)], dim=1)  # beams differ
        step_equals_full()


def test_sinusoidal_positions_match_the_formula():
    d = 16
    pe = sinusoidal_positions(50, d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_tensor2tensor_sinusoids_are_marians():
    """Marian's SinusoidalPositionEmbeddings (src/tensors/cpu/tensor_operators.cpp): the i-th of the
    D/2 sines and cosines at frequency exp(-i ln(10000) / (D/2 - 1)), here interleaved as xf's."""
    d = 16
    pe = sinusoidal_positions(50, d, "tensor2tensor")
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos * math.exp(-i * math.log(10000) / (d // 2 - 1))
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_zero_decoder_start_ignores_the_start_token_and_caches_as_it_decodes():
    model = tiny(decoder_start="zero")
    src, prev = torch.tensor([[5, 6, 7, 3]]), torch.tensor([[2, 8, 9]])
    with torch.no_grad():
        full, features = model(src, prev), model(src, prev, features_only=True)
        model.decoder_embed.weight[2] += 1.0  # bos's row: never read at position 0 (only its logit moves)
        assert torch.equal(model(src, prev, features_only=True), features)
        model.decoder_embed.weight[2] -= 1.0
        memory, src_pad = model.encode(src)
        cache = model.new_cache()
        steps = [model.decode(prev[:, t : t + 1], memory, src_pad, cache) for t in range(3)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


def test_three_way_tying_is_one_tensor():
    model = tiny()
    assert model.encoder_embed.weight is model.decoder_embed.weight
    assert model.output_proj.weight is model.decoder_embed.weight
    partial = tiny(share_embeddings="decoder")
    assert partial.output_proj.weight is partial.decoder_embed.weight
    assert partial.encoder_embed.weight is not partial.decoder_embed.weight
    untied = tiny(share_embeddings="none")
    assert untied.output_proj.weight is not untied.decoder_embed.weight


def transformer_parameters(V: int, d: int, ff: int, n_enc: int, n_dec: int) -> int:
    """The paper's model counted by hand: one V x d matrix (three-way tied embeddings and output
    projection, no output bias, sinusoids have none); per attention 4 d x d weights + 4d biases;
    per feed-forward 2 d x ff weights + ff + d biases; per LayerNorm 2d."""
    attention, ffn, norm = 4 * d * d + 4 * d, 2 * d * ff + ff + d, 2 * d
    return V * d + n_enc * (attention + ffn + 2 * norm) + n_dec * (2 * attention + ffn + 3 * norm)


@pytest.mark.slow
def test_parameter_counts_match_the_paper():
    # Table 3: base 65M, big 213M (with a 37,000-token joint vocabulary).
    base = build_model("base", vocab_size=37000).num_parameters()
    big = build_model("big", vocab_size=37000).num_parameters()
    assert base == transformer_parameters(37000, 512, 2048, 6, 6) == 63_082_496
    assert big == transformer_parameters(37000, 1024, 4096, 6, 6)
    assert round(base / 1e6) == 63 and round(big / 1e6) == 214  # the paper rounds to 65M and 213M


def test_small_preset_shape():
    cfg = model_config("small")
    assert (cfg.encoder_layers, cfg.decoder_layers, cfg.d_model, cfg.d_ff, cfg.heads) == (3, 3, 256, 1024, 4)
    assert set(PRESETS) >= {"base", "big", "small", "tiny"}


def test_post_ln_and_pre_ln_differ_in_structure():
    post, pre = tiny(), tiny(normalize_before=True)
    assert isinstance(post.encoder_norm, torch.nn.Identity)
    assert isinstance(pre.encoder_norm, torch.nn.LayerNorm)
    # Post-LN: every encoder output row is layer-normalized (zero mean, unit variance).
    src, _ = batch()
    memory, _ = post.encode(src)
    ln = post.encoder_layers[-1].ffn_block.norm
    normed = (memory - ln.bias) / ln.weight
    torch.testing.assert_close(normed.mean(-1), torch.zeros_like(normed.mean(-1)), atol=1e-4, rtol=0)


@pytest.mark.parametrize("activation,width", [("relu", 128), ("gelu", 128), ("swiglu", 256)])
def test_activation_switches(activation, width):
    model = tiny(activation=activation)
    assert model.encoder_layers[0].ffn.fc1.out_features == width
    assert model.encoder_layers[0].ffn.activation == activation


def test_unknown_override_names_nearest_field():
    from xformer_cli.base.errors import ConfigError

    with pytest.raises(ConfigError, match="did you mean 'dropout'"):
        build_model("tiny", vocab_size=V, dropuot=0.1)
    with pytest.raises(ConfigError, match="unknown arch"):
        build_model("huge", vocab_size=V)


@pytest.mark.slow
def test_learns_copy_task():
    """A tiny model learns to copy random sequences: gradients flow through the whole model."""
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=20, dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    g = torch.Generator().manual_seed(0)

    def sample(n):
        src = torch.randint(4, 20, (n, 8), generator=g)
        prev = torch.cat([torch.full((n, 1), 2), src], dim=1)  # bos + target
        gold = torch.cat([src, torch.full((n, 1), 3)], dim=1)  # target + eos
        return src, prev, gold

    model.train()
    for _ in range(300):
        src, prev, gold = sample(64)
        loss = torch.nn.functional.cross_entropy(model(src, prev).flatten(0, 1), gold.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    src, prev, gold = sample(256)
    with torch.no_grad():
        acc = (model(src, prev).argmax(-1) == gold).float().mean().item()
    assert acc >= 0.99, acc


@pytest.mark.parametrize("t, s", [(5, 7), (1, 9), (6, 6)])
@pytest.mark.parametrize("kind", ["bool", "float", "causal", "none"])
def test_matmul_attention_equals_sdpa(kind, t, s):
    """The CPU matmul path for short sequences computes what SDPA computes, forward and backward."""
    torch.manual_seed(0)
    if kind == "causal":
        s = t
    q, k, v = (torch.randn(3, 2, n, 8, dtype=torch.float64, requires_grad=True) for n in (t, s, s))
    mask = None
    if kind == "bool":
        mask = torch.rand(3, 1, t, s) > 0.3
        mask[..., 0] = True  # every query sees at least one key
    elif kind == "float":
        mask = torch.randn(1, 2, t, s, dtype=torch.float64)
    ours = attention(q, k, v, mask, causal=kind == "causal")
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=kind == "causal")
    torch.testing.assert_close(ours, ref)
    grads = torch.autograd.grad(ours.square().sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_matmul_attention_fully_masked_row_stays_finite():
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    mask = torch.tensor([[True, True, False], [False, False, False]]).view(1, 1, 2, 3)
    assert torch.isfinite(attention(q, k, v, mask)).all()


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout_keeps_the_expectation(p):
    torch.manual_seed(0)
    drop = Dropout(p).train()
    x = torch.ones(400, 1000, requires_grad=True)
    y = drop(x)
    kept = y.ne(0)
    assert abs(kept.float().mean().item() - (1 - p)) < 0.005  # 400k draws: sd 0.0007
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / (1 - p)), rtol=1e-4, atol=0)
    assert abs(y.mean().item() - 1.0) < 0.01
    # lanes are independent: rows do not repeat each other's pattern
    assert not torch.equal(kept[0], kept[1])
    y.sum().backward()
    assert torch.equal(x.grad.ne(0), kept)  # the gradient flows through the kept elements only
    torch.testing.assert_close(x.grad[kept], y[kept].detach())


def test_dropout_is_identity_in_eval_and_reproducible_from_the_seed():
    x = torch.randn(50, 30)
    assert Dropout(0.5).eval()(x) is x
    torch.manual_seed(3)
    a = Dropout(0.5).train()(x)
    torch.manual_seed(3)
    b = Dropout(0.5).train()(x)
    assert torch.equal(a, b)
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))


@pytest.mark.parametrize("field,value", [
    ("d_model", 0), ("heads", 0), ("d_ff", 0), ("encoder_layers", 0), ("decoder_layers", -1),
    ("vocab_size", 0), ("max_positions", 0), ("dropout", 1.0), ("attention_dropout", -0.1),
])
def test_non_positive_sizes_are_one_line_config_errors(field, value):
    from xformer_cli.base.errors import ConfigError

    name = field.replace("_", "[-_]")  # --d-model on the command line, d_model in YAML
    got = f"{value:g}" if isinstance(value, float) else value  # the message writes 1.0 as 1
    with pytest.raises(ConfigError, match=rf"{name} must .*, got {got}") as e:
        build_model("tiny", **{"vocab_size": V, field: value})
    assert "\n" not in str(e.value)



# -- --head-dim (Table 3 rows A and B) -------------------------------------------------------------
def test_head_dim_sizes_the_projections_and_defaults_to_d_model_over_heads():
    assert model_config("tiny", vocab_size=V).head_dim == 16  # 64 / 4, resolved: what checkpoints record
    model = tiny(head_dim=8)  # h * d_k = 32
    attn = model.encoder_layers[0].self_attn
    assert attn.in_proj.weight.shape == (3 * 32, 64) and attn.out_proj.weight.shape == (64, 32)
    cross = model.decoder_layers[0].cross_attn
    assert cross.in_proj.weight.shape == (3 * 32, 64)
    # 3 attentions per layer pair (2 + 2 layers: 6 in all) shrink by (64 - 32) * (3 * 64 + 3 + 64)
    assert tiny().num_parameters() - model.num_parameters() == 6 * 32 * (3 * 64 + 3 + 64)


def test_head_dim_lifts_the_divisibility_rule():
    from xformer_cli.base.errors import ConfigError

    with pytest.raises(ConfigError, match="not divisible by heads 3 .or set --head-dim."):
        model_config("tiny", vocab_size=V, heads=3)
    assert model_config("tiny", vocab_size=V, heads=3, head_dim=24).head_dim == 24
    with pytest.raises(ConfigError, match="--head-dim must be at least 1, got 0"):
        model_config("tiny", vocab_size=V, head_dim=0)
    with pytest.raises(ConfigError, match="rope needs an even head size"):
        model_config("tiny", vocab_size=V, head_dim=7, positions="rope")


def test_int8_quantization_keeps_a_head_dim_model_close():
    from xformer_cli.decode.engines import quantize_int8

    model = tiny(head_dim=8)
    src, tgt = batch()
    full = model(src, tgt)
    quantized = quantize_int8(tiny(head_dim=8))
    memory, src_pad = quantized.encode(src)
    cache = quantized.new_cache()  # cross-attention's split projections, step by step
    steps = torch.cat([quantized.decode(tgt[:, i : i + 1], memory, src_pad, cache) for i in range(tgt.size(1))], 1)
    cross = quantized.decoder_layers[0].cross_attn
    assert isinstance(cross.kv_proj, torch.ao.nn.quantized.dynamic.Linear) and cross.kv_proj.out_features == 2 * 32
    assert (steps.argmax(-1) == full.argmax(-1)).float().mean() > 0.9
    assert (steps - full).abs().max() < 0.1 * full.abs().max()
