"""flops.training_flops: the analytic count equals torch's FlopCounterMode on batches without
padding, and counts no padding on batches with it."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from xformer_cli.data.batching import collate
from xformer_cli.model.flops import training_flops
from xformer_cli.train.loss import label_smoothed_loss
from xformer_cli.model.transformer import Transformer
from xformer_cli.settings.options import ModelConfig


def counted(cfg: ModelConfig, pairs) -> int:
    """FlopCounterMode's count of one training step (forward, full logits, loss, backward)."""
    torch.manual_seed(0)
    model = Transformer(cfg)
    batch = collate(pairs)
    with FlopCounterMode(display=False) as counter:
        logits = model(batch["src"], batch["prev_output"])
        loss, _ = label_smoothed_loss(logits, batch["target"], 0.1)
        loss.backward()
    return counter.get_total_flops()


def lengths(pairs):
    return [len(s) + 1 for s, _ in pairs], [len(t) + 1 for _, t in pairs]  # collate adds eos / bos


def test_a_hand_counted_model():
    """d 4, FFN 8, V 10, one layer each, one pair with S = 2 and T = 3 positions, by hand:
    encoder 2*(64+64)*2 + 4*4*4 = 576; decoder 2*(64+64)*3 + 4*4*9 + 4*16*5 + 4*4*6 = 1328;
    output 2*4*10*3 = 240; training 3 * 2144 = 6432."""
    cfg = ModelConfig(vocab_size=10, encoder_layers=1, decoder_layers=1, d_model=4, d_ff=8, heads=1)
    assert training_flops(cfg, [2], [3]) == 6432


@pytest.mark.parametrize("activation", ["relu", "swiglu"])
def test_equals_torchs_count_on_a_batch_without_padding(activation):
    cfg = ModelConfig(vocab_size=50, encoder_layers=2, decoder_layers=3, d_model=32, d_ff=48, heads=4,
                      dropout=0.0, activation=activation)
    g = torch.Generator().manual_seed(1)
    pairs = [(torch.randint(4, 50, (7,), generator=g).numpy(), torch.randint(4, 50, (10,), generator=g).numpy())
             for _ in range(5)]  # every pair the same lengths: no padding
    assert counted(cfg, pairs) == training_flops(cfg, *lengths(pairs))


@pytest.mark.slow
def test_padding_is_not_counted():
    """A padded batch costs torch more than the analytic count of its pairs, which is the sum of
    the pairs counted one by one (each alone has no padding)."""
    cfg = ModelConfig(vocab_size=50, encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2, dropout=0.0)
    g = torch.Generator().manual_seed(2)
    pairs = [(torch.randint(4, 50, (n,), generator=g).numpy(), torch.randint(4, 50, (m,), generator=g).numpy())
             for n, m in ((3, 9), (12, 4), (6, 6))]
    one_by_one = sum(counted(cfg, [p]) for p in pairs)
    assert training_flops(cfg, *lengths(pairs)) == one_by_one
    assert counted(cfg, pairs) > one_by_one
