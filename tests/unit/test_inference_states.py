"""The instance state machine: one table, checked in one function."""

import pickle

import pytest

from orchestrator.inference import (
    LIVE_STATES,
    SERVING_STATES,
    TRANSITIONS,
    IllegalTransition,
    InstanceState,
    check_transition,
)

S = InstanceState


def test_every_state_has_its_row() -> None:
    assert set(TRANSITIONS) == set(InstanceState)
    assert [str(s) for s in InstanceState] == ["stopped", "starting", "ready", "running", "failed"]


@pytest.mark.parametrize(
    ("current", "new"),
    [
        # the moves SPEC part 3 shows
        (S.STOPPED, S.STARTING),
        (S.STARTING, S.READY),
        (S.READY, S.RUNNING),
        (S.RUNNING, S.READY),
        (S.STARTING, S.FAILED),
        # ours: crashes after start, stops, respawn by a restarted actor
        (S.READY, S.FAILED),
        (S.RUNNING, S.FAILED),
        (S.STARTING, S.STOPPED),
        (S.READY, S.STOPPED),
        (S.RUNNING, S.STOPPED),
        (S.FAILED, S.STOPPED),
        (S.READY, S.STARTING),
        (S.RUNNING, S.STARTING),
        (S.STARTING, S.STARTING),
    ],
)
def test_allowed_moves(current: InstanceState, new: InstanceState) -> None:
    check_transition(current, new)


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (S.STOPPED, S.READY),
        (S.STOPPED, S.RUNNING),
        (S.STOPPED, S.STOPPED),
        (S.STOPPED, S.FAILED),
        (S.STARTING, S.RUNNING),
        (S.FAILED, S.STARTING),
        (S.FAILED, S.READY),
        (S.FAILED, S.FAILED),
        (S.READY, S.READY),
    ],
)
def test_illegal_moves_are_conflicts(current: InstanceState, new: InstanceState) -> None:
    with pytest.raises(IllegalTransition) as caught:
        check_transition(current, new)
    assert caught.value.status_code == 409
    assert str(current) in caught.value.message and str(new) in caught.value.message


def test_state_groups_and_pickling() -> None:
    assert LIVE_STATES == {S.STARTING, S.READY, S.RUNNING}
    assert SERVING_STATES == {S.READY, S.RUNNING}
    err = pickle.loads(pickle.dumps(IllegalTransition("no")))
    assert isinstance(err, IllegalTransition) and err.message == "no"
