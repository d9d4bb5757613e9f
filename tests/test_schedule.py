"""Learning-rate schedules against hand-computed values."""

import math

import pytest

from xformer_cli.train.schedule import inverse_sqrt, make_schedule, noam


def test_noam_peak_is_the_papers():
    # (512 * 4000)^-0.5 = 1 / sqrt(2,048,000) = 6.98771e-4, reached at step == warmup
    assert noam(4000, 512, 4000) == pytest.approx(6.98771e-4, rel=1e-5)
    assert noam(3999, 512, 4000) < noam(4000, 512, 4000) > noam(4001, 512, 4000)


def test_noam_hand_computed_points():
    # warmup: 512^-0.5 * 1 * 4000^-1.5 = 0.0441942 * 3.95285e-6
    assert noam(1, 512, 4000) == pytest.approx(1.74693e-7, rel=1e-5)
    # after warmup: 512^-0.5 * 16000^-0.5 = 0.0441942 / 126.491
    assert noam(16000, 512, 4000) == pytest.approx(3.49386e-4, rel=1e-5)
    assert noam(16000, 512, 4000, factor=2.0) == pytest.approx(2 * 3.49386e-4, rel=1e-5)
    assert noam(0, 512, 4000) == noam(1, 512, 4000)  # step 0 is treated as the first step


def test_inverse_sqrt():
    assert inverse_sqrt(0, 5e-4, 4000, init=1e-7) == pytest.approx(1e-7)
    assert inverse_sqrt(2000, 5e-4, 4000, init=0.0) == pytest.approx(2.5e-4)
    assert inverse_sqrt(4000, 5e-4, 4000) == pytest.approx(5e-4)
    assert inverse_sqrt(16000, 5e-4, 4000) == pytest.approx(2.5e-4)  # sqrt(4000 / 16000) = 1/2


def test_inverse_sqrt_with_the_noam_peak_is_noam():
    peak = (512 * 4000) ** -0.5
    for step in (1, 100, 3999, 4000, 4001, 10**5):
        assert inverse_sqrt(step, peak, 4000) == pytest.approx(noam(step, 512, 4000), rel=1e-9)


def test_learning_rate_dispatch():
    assert make_schedule("noam", 512, 4000, None, 0.0)(4000) == noam(4000, 512, 4000)
    assert make_schedule("noam", 512, 4000, 0.5, 0.0)(4000) == 0.5 * noam(4000, 512, 4000)
    assert make_schedule("inverse_sqrt", 512, 2000, 1e-3, 0.0)(8000) == pytest.approx(1e-3 * math.sqrt(0.25))
    with pytest.raises(ValueError, match="--lr"):
        make_schedule("inverse_sqrt", 512, 4000, None, 0.0)
