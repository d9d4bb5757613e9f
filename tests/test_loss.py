"""Label-smoothed cross-entropy against a hand-computed value and PyTorch's own implementation."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from xformer_cli.train.loss import fused_output_loss, label_smoothed_loss


def test_hand_computed():
    # p = softmax(0, ln 2, ln 3) = (1/6, 1/3, 1/2); the reference token is 1 (p = 1/3).
    logits = torch.tensor([[[0.0, math.log(2), math.log(3)], [5.0, -1.0, 2.0]]])  # (B=1, T=2, V=3)
    target = torch.tensor([[1, 0]])  # the second position is padding: ignored
    loss, nll = label_smoothed_loss(logits, target, epsilon=0.1)
    assert nll.item() == pytest.approx(math.log(3))
    # (1 - 0.1) * ln 3 + 0.1 / 3 * (ln 6 + ln 3 + ln 2)
    assert loss.item() == pytest.approx(0.9 * math.log(3) + 0.1 / 3 * math.log(36))
    loss0, nll0 = label_smoothed_loss(logits, target, epsilon=0.0)
    assert loss0.item() == pytest.approx(math.log(3)) and nll0.item() == pytest.approx(math.log(3))


def test_equals_torch_cross_entropy_with_label_smoothing_and_its_gradient():
    torch.manual_seed(0)
    logits = (3 * torch.randn(4, 7, 50, dtype=torch.float64)).requires_grad_()
    target = torch.randint(1, 50, (4, 7))
    target[0, 5:] = 0
    target[2, 3:] = 0
    loss, nll = label_smoothed_loss(logits, target, epsilon=0.1)
    ref = F.cross_entropy(logits.reshape(-1, 50), target.reshape(-1), ignore_index=0, reduction="sum",
                          label_smoothing=0.1)
    ref_nll = F.cross_entropy(logits.reshape(-1, 50), target.reshape(-1), ignore_index=0, reduction="sum")
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert nll.item() == pytest.approx(ref_nll.item(), rel=1e-6)
    (grad,) = torch.autograd.grad(loss, logits)
    (ref_grad,) = torch.autograd.grad(ref, logits)
    torch.testing.assert_close(grad.double(), ref_grad)
    assert grad[0, 6].abs().max() == 0  # padding gets no gradient


def test_low_precision_logits_sum_in_float32():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11)
    target = torch.randint(1, 11, (2, 3))
    loss32, _ = label_smoothed_loss(logits, target, 0.1)
    loss16, _ = label_smoothed_loss(logits.bfloat16(), target, 0.1)
    assert loss16.dtype == torch.float32
    assert loss16.item() == pytest.approx(loss32.item(), rel=2e-2)


@pytest.mark.parametrize("epsilon,chunk_rows", [(0.1, 5), (0.0, 64), (0.1, 0)])
def test_fused_output_loss_equals_projection_then_loss(epsilon, chunk_rows):
    torch.manual_seed(0)
    x = torch.randn(3, 8, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 40, (3, 8))
    target[1, 4:] = 0
    ref_loss, ref_nll = label_smoothed_loss(x @ w.t(), target, epsilon)
    ref_grads = torch.autograd.grad(2.5 * ref_loss, (x, w))
    loss, nll = fused_output_loss(x, w, target, epsilon, chunk_rows)
    grads = torch.autograd.grad(2.5 * loss, (x, w))
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-12)
    assert nll.item() == pytest.approx(ref_nll.item(), rel=1e-12) and not nll.requires_grad
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)
    assert grads[0][1, 4:].abs().max() == 0  # padding rows get no gradient


def test_fused_output_loss_with_host_found_rows_is_bit_identical():
    """collate's ``target_rows`` (found on the host, so the device is never read) select the same
    rows as the boolean mask: the same loss and gradients, bit for bit."""
    from xformer_cli.data.batching import collate

    rng = np.random.default_rng(0)
    batch = collate([(rng.integers(4, 40, rng.integers(1, 9)), rng.integers(4, 40, rng.integers(1, 9)))
                     for _ in range(6)])
    target = batch["target"]
    assert batch["target_rows"].numel() == batch["ntokens"]
    torch.manual_seed(0)
    w = torch.randn(40, 16, requires_grad=True)
    results = []
    for rows in (None, batch["target_rows"]):
        x = torch.randn(*target.shape, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
        loss, nll = fused_output_loss(x, w, target, 0.1, 7, rows=rows)
        results.append((loss, nll, *torch.autograd.grad(loss, (x, w))))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_fused_output_loss_without_grad_and_under_bf16_autocast():
    torch.manual_seed(0)
    x, w = torch.randn(2, 5, 16), 0.3 * torch.randn(30, 16)
    target = torch.randint(1, 30, (2, 5))
    ref, _ = label_smoothed_loss(x @ w.t(), target, 0.1)
    with torch.no_grad():
        loss, _ = fused_output_loss(x, w, target, 0.1)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss16, _ = fused_output_loss(x.requires_grad_(), w, target, 0.1)
    loss16.backward()
    assert loss16.dtype == torch.float32 and loss16.item() == pytest.approx(ref.item(), rel=2e-2)
    assert x.grad.dtype == torch.float32 and torch.isfinite(x.grad).all()
