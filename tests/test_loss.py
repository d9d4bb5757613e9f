"""Label-smoothed cross-entropy against a hand-computed value and PyTorch's own implementation."""

import math

import pytest
import torch
import torch.nn.functional as F

from xformer_cli.loss import label_smoothed_loss


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
