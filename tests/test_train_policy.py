"""The training policy alone: after an update, log? validate? which checkpoints? stop, and why?"""

import pytest

from xformer_cli.settings.options import TrainOptions
from xformer_cli.train.policy import AfterUpdate, Plan, improves, plan_after_validation, plan_update


def policy_opts(**kw) -> TrainOptions:
    return TrainOptions(data="d", **{"log_interval": 10, "save_interval_minutes": 0.0, **kw})


def after(update, epoch=1, end_of_epoch=False, out_of_time=False, seconds_since_save=0.0) -> AfterUpdate:
    return AfterUpdate(epoch, update, end_of_epoch, out_of_time, seconds_since_save)


def test_policy_does_nothing_between_intervals_and_logs_at_the_log_interval():
    o = policy_opts(validate_interval_updates=4, save_interval_updates=6)
    assert plan_update(o, after(3)) == Plan(log=False, validate=False, checkpoints=(), save=False, stop=None)
    assert plan_update(o, after(10)) == Plan(log=True, validate=False, checkpoints=(), save=False, stop=None)


def test_policy_intervals_validate_and_save_numbered_checkpoints():
    o = policy_opts(validate_interval_updates=4, save_interval_updates=6)
    assert plan_update(o, after(8)) == Plan(log=False, validate=True, checkpoints=(), save=True, stop=None)
    assert plan_update(o, after(12, epoch=2)) == Plan(
        log=False, validate=True, checkpoints=("checkpoint_2_12.pt",), save=True, stop=None)


def test_policy_epoch_end_validates_and_writes_a_numbered_checkpoint():
    plan = plan_update(policy_opts(), after(7, epoch=3, end_of_epoch=True))
    assert plan == Plan(log=False, validate=True, checkpoints=("checkpoint_3_7.pt",), save=True, stop=None)


@pytest.mark.parametrize("options,state,reason", [
    (dict(max_update=5), after(5), "reached --max-update 5"),
    (dict(max_epoch=2), after(9, epoch=2, end_of_epoch=True), "reached --max-epoch 2"),
    (dict(stop_time_hours=0.5), after(9, out_of_time=True), "reached --stop-time-hours 0.5"),
])
def test_policy_every_stop_validates_and_writes_a_numbered_checkpoint(options, state, reason):
    plan = plan_update(policy_opts(**options), state)
    assert plan.stop == reason and plan.validate and plan.save
    assert plan.checkpoints == (f"checkpoint_{state.epoch}_{state.num_updates}.pt",)


def test_policy_max_epoch_waits_for_the_epoch_end():
    assert plan_update(policy_opts(max_epoch=2), after(9, epoch=2)).stop is None


def test_policy_save_interval_minutes_refreshes_checkpoint_last_only():
    o = policy_opts(save_interval_minutes=10.0)
    assert plan_update(o, after(3, seconds_since_save=599.0)).save is False
    assert plan_update(o, after(3, seconds_since_save=600.0)) == Plan(
        log=False, validate=False, checkpoints=(), save=True, stop=None)


def test_policy_after_validation_adds_the_best_checkpoint():
    o = policy_opts(validate_interval_updates=4)
    plan = plan_update(o, after(4))
    assert plan_after_validation(o, plan, after(4), improved=True, bad_validations=0).checkpoints == (
        "checkpoint_best.pt",)
    assert plan_after_validation(o, plan, after(4), improved=False, bad_validations=1) == plan


def test_policy_patience_stop_writes_a_numbered_checkpoint():
    o = policy_opts(validate_interval_updates=4, patience=2)
    plan = plan_update(o, after(8))
    assert plan_after_validation(o, plan, after(8), improved=False, bad_validations=1).stop is None
    stopped = plan_after_validation(o, plan, after(8), improved=False, bad_validations=2)
    assert stopped == Plan(log=False, validate=True, checkpoints=("checkpoint_1_8.pt",), save=True,
                           stop="no improvement in 2 validations (--patience)")
    # at an epoch end the numbered checkpoint is already planned: not written twice
    end = after(8, end_of_epoch=True)
    assert plan_after_validation(o, plan_update(o, end), end, False, 2).checkpoints == ("checkpoint_1_8.pt",)


def test_patience_epsilon_counts_small_gains_as_none_but_keeps_them_as_the_best():
    from xformer_cli.train.policy import score_validation

    # without epsilon every gain resets the count
    assert score_validation(2.99, 3.0, 2, higher_is_better=False) == (True, 2.99, 0)
    # with it: 3.0 -> 2.995 is the new best (checkpoint_best.pt) but no improvement for --patience
    assert score_validation(2.995, 3.0, 1, higher_is_better=False, epsilon=0.01) == (True, 2.995, 2)
    assert score_validation(2.98, 3.0, 2, higher_is_better=False, epsilon=0.01) == (True, 2.98, 0)
    assert score_validation(3.1, 3.0, 1, higher_is_better=False, epsilon=0.01) == (False, 3.0, 2)
    assert score_validation(5.0, None, 0, higher_is_better=False, epsilon=0.01) == (True, 5.0, 0)  # the first
    assert score_validation(20.5, 20.0, 1, higher_is_better=True, epsilon=1.0) == (True, 20.5, 2)  # BLEU
    assert score_validation(21.5, 20.0, 1, higher_is_better=True, epsilon=1.0) == (True, 21.5, 0)
    o = policy_opts(validate_interval_updates=4, patience=2, patience_epsilon=0.01)
    stopped = plan_after_validation(o, plan_update(o, after(8)), after(8), improved=True, bad_validations=2)
    assert stopped.stop == "no improvement above 0.01 in 2 validations (--patience, --patience-epsilon)"
    assert "checkpoint_best.pt" in stopped.checkpoints  # a small gain is still the best checkpoint


def test_improves_lower_loss_or_higher_bleu():
    assert improves(2.0, None, higher_is_better=False) and improves(2.0, 3.0, higher_is_better=False)
    assert not improves(3.0, 3.0, higher_is_better=False) and not improves(4.0, 3.0, higher_is_better=False)
    assert improves(30.0, 20.0, higher_is_better=True) and not improves(20.0, 30.0, higher_is_better=True)


def test_an_update_that_compiles_a_graph_is_compile_time_not_speed():
    """Regression: --compile's second graph (at update 2) entered the summary speed."""
    from types import SimpleNamespace

    import torch

    from xformer_cli.train.log import Meter

    graphs = iter([0, 1, 2, 2, 2, 3, 3])  # at start, then after each of six updates: compiles at 1, 2 and 5
    meter = Meter(torch.device("cpu"), lambda: next(graphs))
    step = SimpleNamespace(finite=torch.tensor(True), loss_sums=torch.zeros(2, dtype=torch.float64),
                           gnorm=torch.tensor(1.0))
    for seconds in (20.0, 15.0, 1.0, 1.0, 12.0, 1.0):
        meter.add(step, ntokens=100, src_tokens=90, seconds=seconds)
    assert meter.compile_seconds == 47.0
    assert meter.timed["updates"] == 3 and meter.timed["seconds"] == 3.0 and meter.timed["tgt"] == 300
    eager = Meter(torch.device("cpu"))  # without --compile: only the first update is left out
    for seconds in (20.0, 15.0, 1.0):
        eager.add(step, ntokens=100, src_tokens=90, seconds=seconds)
    assert eager.compile_seconds == 0.0 and eager.timed["updates"] == 2 and eager.timed["seconds"] == 16.0
