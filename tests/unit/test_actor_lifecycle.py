"""The actor lifecycle (``corral.actors.lifecycle``): the AFTER_STOP table row by row, the
intents, deferred wake, generation fences, thresholds, restart backoff and alarms."""

from __future__ import annotations

from dataclasses import replace

import pytest

from corral.actors import lifecycle as lc
from corral.actors.lifecycle import ActorState, After, CrashPolicy, Ending, Life
from corral.errors import IllegalTransition

R = "rnr_a"
T0 = 1000.0


def running(policy: CrashPolicy = CrashPolicy.RESTART, generation: int = 1) -> Life:
    life, _ = lc.new_life(policy, T0)
    life = replace(lc.placed(life, R, T0), generation=generation)
    return lc.step(life, lc.Running(R, generation), T0 + 1).life


def test_a_new_actor_is_pending_and_asks_to_be_placed() -> None:
    life, effects = lc.new_life(CrashPolicy.SLEEP, T0)
    assert life.state is ActorState.PENDING and life.pending_allocation_at == T0
    assert effects == [lc.Place()]


def test_placed_starts_the_next_generation_with_a_start_threshold() -> None:
    life, _ = lc.new_life(CrashPolicy.RESTART, T0)
    started = lc.placed(life, R, T0)
    assert (started.state, started.generation, started.runner_id) == (ActorState.STARTING, 1, R)
    assert started.deadline_at == T0 + lc.START_THRESHOLD_S
    assert not started.connectable


def test_running_makes_it_connectable_and_clears_the_threshold() -> None:
    life = running()
    assert life.state is ActorState.RUNNING and life.connectable
    assert life.connectable_at == T0 + 1 and life.deadline_at is None


# ---- AFTER_STOP, row by row ------------------------------------------------------------------


def test_row_destroy_was_asked() -> None:
    life = replace(running(), destroying=True, state=ActorState.STOPPING)
    assert lc.after_stop(life, Ending.CRASHED) is After.DESTROY


def test_row_marked_sleeping_and_woken_meanwhile_wakes() -> None:
    life = replace(running(), state=ActorState.SLEEPING, will_wake=True)
    assert lc.after_stop(life, Ending.EXITED) is After.WAKE


def test_row_marked_sleeping_sleeps() -> None:
    life = replace(running(CrashPolicy.DESTROY), state=ActorState.SLEEPING)
    assert lc.after_stop(life, Ending.CRASHED) is After.SLEEP
    assert lc.after_stop(life, Ending.LOST) is After.SLEEP


@pytest.mark.parametrize("policy", list(CrashPolicy))
def test_row_graceful_exit_destroys_whatever_the_policy(policy: CrashPolicy) -> None:
    assert lc.after_stop(running(policy), Ending.EXITED) is After.DESTROY


def test_an_exit_0_while_its_runner_goes_away_is_not_graceful() -> None:
    life = replace(running(CrashPolicy.RESTART), going_away=True)
    assert lc.after_stop(life, Ending.EXITED) is After.RESTART


@pytest.mark.parametrize(
    ("policy", "after"),
    [
        (CrashPolicy.RESTART, After.RESTART),
        (CrashPolicy.SLEEP, After.SLEEP),
        (CrashPolicy.DESTROY, After.DESTROY),
    ],
)
@pytest.mark.parametrize("ending", [Ending.CRASHED, Ending.LOST])
def test_rows_crash_or_lost_follow_the_policy(
    policy: CrashPolicy, after: After, ending: Ending
) -> None:
    assert lc.after_stop(running(policy), ending) is after


def test_the_table_has_one_row_per_case_of_the_issue() -> None:
    assert [row[2] for row in lc.AFTER_STOP] == [
        After.DESTROY,
        After.WAKE,
        After.SLEEP,
        After.DESTROY,
        After.RESTART,
        After.SLEEP,
        After.DESTROY,
    ]


# ---- endings carried out ---------------------------------------------------------------------


def test_graceful_exit_destroys_and_drops_the_kv() -> None:
    out = lc.step(running(), lc.Stopped(R, 1, code=0), T0 + 5)
    assert out.life.state is ActorState.DESTROYED and out.life.destroyed_at == T0 + 5
    assert out.life.runner_id is None
    assert out.effects == (lc.DropKv(),)


def test_first_crash_restarts_at_once_then_backs_off_2s_doubling() -> None:
    life = running(CrashPolicy.RESTART)
    out = lc.step(life, lc.Stopped(R, 1, code=1), T0 + 5)
    assert out.life.state is ActorState.PENDING and out.effects == (lc.Place(),)
    assert out.life.restarts == 0 and out.life.last_restart_at == T0 + 5
    delays = []
    now = T0 + 5
    life = out.life
    for generation in range(2, 13):
        life = lc.step(lc.placed(life, R, now), lc.Stopped(R, generation, code=1), now + 1).life
        now += 1
        assert life.state is ActorState.STOPPED
        assert life.reschedule_at is not None
        delays.append(life.reschedule_at - now)
        life = replace(life, state=ActorState.PENDING, reschedule_at=None)
    assert delays[:4] == [2.0, 4.0, 8.0, 16.0]
    assert delays[-1] == 2.0 * 2**8  # capped at 2^8


def test_restarts_are_forgotten_after_ten_healthy_minutes() -> None:
    life = replace(running(), restarts=5, last_restart_at=T0)
    assert lc.restart_delay(life, T0 + 599)[0] == 2.0 * 2**5
    assert lc.restart_delay(life, T0 + lc.RESTART_RESET_S) == (0.0, 0)


def test_stopped_waits_for_its_backoff_then_asks_to_be_placed() -> None:
    life = replace(running(), restarts=1, last_restart_at=T0)
    out = lc.step(life, lc.Stopped(R, 1, code=1), T0 + 2)
    assert out.life.state is ActorState.STOPPED and out.effects == ()
    assert lc.next_deadline(out.life) == T0 + 2 + 4.0
    assert lc.due(out.life, T0 + 5).life == out.life
    later = lc.due(out.life, T0 + 6)
    assert later.life.state is ActorState.PENDING and later.effects == (lc.Place(),)


def test_lost_tells_the_old_runner_to_stop_and_restarts() -> None:
    out = lc.step(running(), lc.Lost(R, 1), T0 + 5)
    assert out.effects == (lc.SendStop(R, 1), lc.Place())
    assert out.life.state is ActorState.PENDING and not out.life.placed


def test_lost_after_crashes_is_placed_again_at_once_and_keeps_its_crash_count() -> None:
    """Its runner gone is not a crash of its own: no backoff (a request may be waiting),
    and the crashes before still set the next crash's backoff."""
    crashed = replace(running(), restarts=5, last_restart_at=T0)
    out = lc.step(crashed, lc.Lost(R, 1), T0 + 3)
    assert out.life.state is ActorState.PENDING and out.effects == (lc.SendStop(R, 1), lc.Place())
    assert (out.life.restarts, out.life.last_restart_at) == (5, T0)
    again = lc.step(lc.placed(out.life, R, T0 + 4), lc.Stopped(R, 2, code=1), T0 + 5)
    assert again.life.state is ActorState.STOPPED
    assert again.life.reschedule_at == T0 + 5 + lc.RESTART_BASE_S * 2**5


def test_crash_with_policy_sleep_sleeps() -> None:
    out = lc.step(running(CrashPolicy.SLEEP), lc.Stopped(R, 1, code=3), T0 + 5)
    assert out.life.state is ActorState.SLEEPING and out.life.sleep_at == T0 + 5
    assert out.effects == ()


def test_crash_with_policy_destroy_destroys() -> None:
    out = lc.step(running(CrashPolicy.DESTROY), lc.Stopped(R, 1, code=3), T0 + 5)
    assert out.life.state is ActorState.DESTROYED and out.effects == (lc.DropKv(),)


# ---- intents ---------------------------------------------------------------------------------


def test_sleep_intent_marks_sleeping_and_sends_stop_a_second_is_ignored() -> None:
    first = lc.step(running(), lc.Sleep(R, 1), T0 + 2)
    assert first.life.state is ActorState.SLEEPING and first.life.placed
    assert first.effects == (lc.SendStop(R, 1),)
    assert first.life.deadline_at == T0 + 2 + lc.STOP_THRESHOLD_S and not first.life.connectable
    second = lc.step(first.life, lc.Sleep(R, 1), T0 + 3)
    assert second.life == first.life and second.effects == ()


def test_stopped_after_sleep_intent_sleeps_unplaced() -> None:
    asleep = lc.step(running(), lc.Sleep(R, 1), T0 + 2).life
    out = lc.step(asleep, lc.Stopped(R, 1, code=0), T0 + 3)
    assert out.life.state is ActorState.SLEEPING and not out.life.placed
    assert out.life.sleep_at == T0 + 2 and out.effects == ()


def test_deferred_wake_reschedules_once_it_has_stopped() -> None:
    asleep = lc.step(running(), lc.Sleep(R, 1), T0 + 2).life
    woken = lc.step(asleep, lc.Wake(), T0 + 3)
    assert woken.life.will_wake and woken.life.state is ActorState.SLEEPING
    assert woken.effects == ()  # not yet: it has not stopped
    again = lc.step(woken.life, lc.Wake(), T0 + 3.5)  # the gateway's retry
    assert again.life == woken.life
    out = lc.step(woken.life, lc.Stopped(R, 1, code=0), T0 + 4)
    assert out.life.state is ActorState.PENDING and out.effects == (lc.Place(),)
    assert not out.life.will_wake and out.life.sleep_at is None


def test_wake_of_a_sleeping_unplaced_actor_places_it() -> None:
    asleep = lc.step(lc.step(running(), lc.Sleep(R, 1), T0).life, lc.Stopped(R, 1, 0), T0).life
    out = lc.step(asleep, lc.Wake(), T0 + 10)
    assert out.life.state is ActorState.PENDING and out.effects == (lc.Place(),)
    assert out.life.pending_allocation_at == T0 + 10


@pytest.mark.parametrize("state", [ActorState.STARTING, ActorState.RUNNING, ActorState.PENDING])
def test_a_stale_retry_wake_of_an_allocated_actor_is_ignored(state: ActorState) -> None:
    life = replace(running(), state=state)
    out = lc.step(life, lc.Wake(), T0 + 5)
    assert out.life == life and out.effects == ()


def test_stop_intent_then_exit_0_destroys() -> None:
    stopping = lc.step(running(CrashPolicy.RESTART), lc.Stop(R, 1), T0 + 1)
    assert stopping.life.state is ActorState.STOPPING and stopping.effects == (lc.SendStop(R, 1),)
    out = lc.step(stopping.life, lc.Stopped(R, 1, code=0), T0 + 2)
    assert out.life.state is ActorState.DESTROYED


def test_sleep_through_the_api_of_a_queued_actor_takes_it_out_of_the_queue() -> None:
    life, _ = lc.new_life(CrashPolicy.RESTART, T0)
    out = lc.step(life, lc.Sleep(), T0 + 1)
    assert out.life.state is ActorState.SLEEPING and out.effects == ()


# ---- going away, no capacity, destroy --------------------------------------------------------


def test_going_away_stops_it_and_it_is_placed_again_at_once() -> None:
    life = replace(running(), restarts=4, last_restart_at=T0)
    away = lc.step(life, lc.GoingAway(R, 1), T0 + 1)
    assert away.life.state is ActorState.STOPPING and away.life.going_away
    assert away.effects == (lc.SendStop(R, 1),)
    assert lc.step(away.life, lc.GoingAway(R, 1), T0 + 1).life == away.life
    out = lc.step(away.life, lc.Stopped(R, 1, code=0), T0 + 2)
    assert out.life.state is ActorState.PENDING and out.effects == (lc.Place(),)
    assert out.life.restarts == 0 and not out.life.going_away


def test_going_away_of_a_sleeping_actor_lets_it_sleep() -> None:
    asleep = lc.step(running(), lc.Sleep(R, 1), T0).life
    away = lc.step(asleep, lc.GoingAway(R, 1), T0 + 1)
    assert away.effects == ()
    assert lc.step(away.life, lc.Lost(R, 1), T0 + 2).life.state is ActorState.SLEEPING


def test_no_capacity_queues_or_sleeps_for_the_sleep_policy_without_serverless() -> None:
    for policy in (CrashPolicy.RESTART, CrashPolicy.DESTROY):
        life, _ = lc.new_life(policy, T0)
        assert lc.no_capacity(life, serverless=False, now=T0).state is ActorState.PENDING
    life, _ = lc.new_life(CrashPolicy.SLEEP, T0)
    assert lc.no_capacity(life, serverless=True, now=T0).state is ActorState.PENDING
    assert lc.no_capacity(life, serverless=False, now=T0).state is ActorState.SLEEPING


def test_destroy_of_a_placed_actor_stops_it_first() -> None:
    out = lc.step(running(CrashPolicy.RESTART), lc.Destroy(), T0 + 1)
    assert out.life.state is ActorState.STOPPING and out.effects == (lc.SendStop(R, 1),)
    end = lc.step(out.life, lc.Stopped(R, 1, code=9), T0 + 2)
    assert end.life.state is ActorState.DESTROYED and end.effects == (lc.DropKv(),)
    assert lc.step(end.life, lc.Wake(), T0 + 3).life == end.life


def test_destroy_of_an_unplaced_actor_is_immediate() -> None:
    life, _ = lc.new_life(CrashPolicy.RESTART, T0)
    out = lc.step(life, lc.Destroy(), T0 + 1)
    assert out.life.state is ActorState.DESTROYED and out.effects == (lc.DropKv(),)


# ---- fences and timers -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "event",
    [
        lc.Stopped(R, 0, code=1),
        lc.Stopped("rnr_other", 1, code=1),
        lc.Lost(R, 2),
        lc.Running("rnr_other", 1),
        lc.Sleep(R, 0),
        lc.GoingAway("rnr_other", 1),
        lc.SetAlarm(R, 0, at=5.0),
    ],
)
def test_events_of_another_placement_are_ignored(event: lc.Event) -> None:
    life = running()
    out = lc.step(life, event, T0 + 1)
    assert out.life == life and out.effects == ()


def test_a_late_stopped_of_the_previous_generation_after_a_restart_is_ignored() -> None:
    restarted = lc.step(running(), lc.Lost(R, 1), T0 + 1).life  # pending, generation 1
    late = lc.step(restarted, lc.Stopped(R, 1, code=0), T0 + 2)
    assert late.life == restarted


def test_start_threshold_makes_it_lost() -> None:
    life, _ = lc.new_life(CrashPolicy.RESTART, T0)
    started = lc.placed(life, R, T0)
    assert lc.next_deadline(started) == T0 + lc.START_THRESHOLD_S
    assert lc.due(started, T0 + 29).life == started
    out = lc.due(started, T0 + 30)
    assert out.effects == (lc.SendStop(R, 1), lc.Place()) and not out.life.placed


def test_a_threshold_waits_again_while_the_runner_is_alive() -> None:
    started = lc.placed(lc.new_life(CrashPolicy.RESTART, T0)[0], R, T0)
    out = lc.due(started, T0 + 30, runner_alive=True)
    assert out.effects == () and out.life.placed and out.life.state is ActorState.STARTING
    assert out.life.deadline_at == T0 + 30 + lc.START_THRESHOLD_S
    asleep = lc.step(running(), lc.Sleep(R, 1), T0).life
    out = lc.due(asleep, T0 + lc.STOP_THRESHOLD_S, runner_alive=True)
    assert out.effects == () and out.life.placed
    assert out.life.deadline_at == T0 + 2 * lc.STOP_THRESHOLD_S


def test_stop_threshold_makes_it_lost() -> None:
    asleep = lc.step(running(), lc.Sleep(R, 1), T0).life
    out = lc.due(asleep, T0 + lc.STOP_THRESHOLD_S)
    assert out.life.state is ActorState.SLEEPING and not out.life.placed
    assert out.effects == (lc.SendStop(R, 1),)


def test_an_alarm_wakes_a_sleeping_actor_and_is_cleared() -> None:
    life = lc.step(running(), lc.SetAlarm(R, 1, at=T0 + 100), T0).life
    life = lc.step(lc.step(life, lc.Sleep(R, 1), T0).life, lc.Stopped(R, 1, 0), T0).life
    assert life.alarm_at == T0 + 100 and lc.next_deadline(life) == T0 + 100
    out = lc.due(life, T0 + 100)
    assert out.life.state is ActorState.PENDING and out.life.alarm_at is None
    assert out.effects == (lc.Place(),)


def test_an_illegal_transition_raises() -> None:
    with pytest.raises(IllegalTransition):
        lc.placed(running(), R, T0)  # placed twice
    with pytest.raises(IllegalTransition):
        lc.no_capacity(running(CrashPolicy.SLEEP), serverless=False, now=T0)
