"""The lines a search prints while it works: each finished trial, the best so far and the cost
so far in trainings of it; on stderr only where nobody configured the logger."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from raybatch import keys
from raybatch.tuning.progress import LOGGER, Progress, printed


def _trial(status: str, micro: int, reached_s: float | None, held_s: float, **extra: Any
           ) -> SimpleNamespace:  # fmt: skip
    """What the callback reads of a Tune trial: its status, config and last result."""
    result = {keys.STATUS: status, keys.TIME_TO_TARGET_S: reached_s, keys.HELD_S: held_s}
    config = {keys.MICRO_BATCH_SIZE: micro, keys.ACCUMULATION_STEPS: 1, keys.LR_MULTIPLIER: 2.0,
              **extra}  # fmt: skip
    return SimpleNamespace(status="TERMINATED", config=config, last_result=result)


def test_a_finished_trial_line_gives_the_best_so_far_and_the_cost_in_trainings_of_it() -> None:
    progress = Progress("trial", total=12, extra_s=2.0)  # held before this phase
    fast = _trial("reached", 128, 2.0, 5.0)
    # Stopped by the scheduler: its last report still says running, and Tune calls back
    # before it marks the trial terminated.
    capped = _trial("running", 1024, None, 3.0, **{keys.WORLD_SIZE: 2})  # two devices held
    capped.status = "RUNNING"
    running = SimpleNamespace(status="RUNNING", config={}, last_result={})
    line = progress.line([fast, capped, running], capped)
    assert line == (
        "trial 2 of 12: 1024 x 1 x 2 workers at 2x: capped | best so far 128 x 1"
        " at 2x, 2.00 s | spent so far 6.5 trainings of it"
    )  # (2 + 5 + 2x3) / 2
    faster = _trial("reached", 256, 1.0, 2.0)
    faster.status = "RUNNING"
    assert progress.line([fast, faster], faster).endswith(
        "reached in 1.00 s | best so far 256 x 1 at 2x, 1.00 s | spent so far 9.0 trainings of it"
    )  # the trial that just ended is the best so far, its own seconds counted: (2 + 5 + 2) / 1
    # Ray errored it with no report: where to look; nothing reached: no cost
    assert progress.line([running], running).endswith(": error (traceback in search.log)")
    broken = _trial("error", 64, None, 1.0)
    broken.last_result[keys.REASON] = "ValueError: bad logits in evaluate()\n  more"
    assert progress.line([broken], broken).endswith(
        ": error: ValueError: bad logits in evaluate() (traceback in search.log)"
    )


def test_race_runs_in_the_search_s_tuner_are_counted_apart_as_race_runs() -> None:
    progress = Progress("trial", total=2)
    searched = [_trial("reached", 128, 2.0, 5.0), _trial("running", 256, None, 1.0)]
    run = _trial("reached", 128, 1.5, 3.0, **{keys.CANDIDATE: 0, keys.SEED: 1})
    assert progress.line([*searched, run], run).startswith("race run 1: 128 x 1 at 2x: reached")
    assert progress.line([*searched, run], searched[1]).startswith("trial 2 of 2: ")


def test_the_best_so_far_is_the_search_s_not_a_race_run_s() -> None:
    """A race run is one seed's time; the recipe fastest on it may still lose the race."""
    progress = Progress("trial", total=2)
    searched = _trial("reached", 128, 2.0, 5.0)
    fast_run = _trial("reached", 256, 1.5, 3.0, **{keys.CANDIDATE: 1, keys.SEED: 1})
    line = progress.line([searched, fast_run], fast_run)
    assert line.startswith("race run 1: 256 x 1 at 2x: reached in 1.50 s")
    assert "best so far 128 x 1 at 2x, 2.00 s" in line


def test_the_lines_print_on_stderr_unless_the_caller_configured_the_logger(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = logging.getLogger(LOGGER)
    with printed(True):
        log.info("searching")
    assert capsys.readouterr().err == "raybatch: searching\n"
    with printed(False):
        log.info("quiet")
    mine: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: mine.append(record.getMessage())  # type: ignore[method-assign]
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        with printed(True):
            log.info("to the caller's handler")
    finally:
        log.removeHandler(handler)
        log.setLevel(logging.NOTSET)
    assert mine == ["to the caller's handler"] and capsys.readouterr().err == ""


def test_what_a_search_spent_so_far_is_slots_x_wall_clock_as_the_closing_lines_say() -> None:
    progress = Progress("trial", total=12)
    first = _trial("reached", 128, 2.0, 5.0, **{})
    first.last_result[keys.STARTED_AT] = 100.0
    second = _trial("capped", 256, None, 3.0)
    second.last_result[keys.STARTED_AT] = 101.0  # beside the first: two slots busy
    third = _trial("capped", 64, None, 1.0)
    third.last_result[keys.STARTED_AT] = 105.0  # after both: the wall clock runs to 106
    assert progress.spent_s([first, second, third]) == 2 * 6.0
    assert progress.line([first, second, third], third).endswith(
        "spent so far 6.0 trainings of it"
    )  # 2 slots x 6 s over the best so far, 2 s


def test_what_a_resumed_search_spent_so_far_leaves_out_the_time_it_lay_interrupted() -> None:
    """Two trials before an interruption (100-106 s), one after the resume at 1000 s: the
    progress line counts each driver session's wall clock (2 slots x (6 + 4) s), as the closing
    lines do, not the 906 s from the first start to the last end."""
    progress = Progress("trial", total=12, sessions=[99.0, 1000.0])
    first = _trial("reached", 128, 2.0, 5.0, **{})
    first.last_result[keys.STARTED_AT] = 100.0
    second = _trial("capped", 256, None, 6.0)
    second.last_result[keys.STARTED_AT] = 100.0
    resumed = _trial("capped", 64, None, 4.0)
    resumed.last_result[keys.STARTED_AT] = 1002.0
    assert progress.spent_s([first, second, resumed]) == 2 * (6.0 + 4.0)
    assert Progress("trial", total=12).spent_s([first, second, resumed]) == 2 * 906.0


def test_a_silence_of_15_s_is_broken_by_what_the_running_trials_are_doing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A model that takes 45 s to build gave 50 s without a line; now every 15 s without one
    says what each running trial is doing: starting (no result yet) or training."""
    now = [100.0]
    progress = Progress("trial", total=4, clock=lambda: now[0])
    building = SimpleNamespace(
        trial_id="a",
        status="RUNNING",
        last_result={},
        config={keys.MICRO_BATCH_SIZE: 64, keys.LR_MULTIPLIER: 1.0},
    )
    training = SimpleNamespace(
        trial_id="b",
        status="RUNNING",
        last_result={keys.TRAIN_S: 12.5, keys.METRIC: 0.81},
        config={keys.MICRO_BATCH_SIZE: 256, keys.LR_MULTIPLIER: 2.0},
    )
    with caplog.at_level(logging.INFO, logger=LOGGER):
        progress.on_step_end(0, [building, training])  # the clock starts at the first step
        progress.on_trial_start(0, [building], building)
        now[0] += 14.0
        progress.on_step_end(1, [building, training])
        assert caplog.messages == []  # 14 s: nothing yet
        now[0] += 2.0
        progress.on_step_end(2, [building, training])
        now[0] += 1.0
        progress.on_step_end(3, [building, training])  # said 1 s ago: not again
    assert caplog.messages == [
        "still working: 64 x 1 at 1x starting for 16 s (its process, data, model, memory"
        " probe); 256 x 1 at 2x training, 12.5 s so far, 0.81 at its last evaluation"
    ]


def test_a_silence_outside_tunes_loop_is_broken_by_what_the_driver_is_busy_with(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ray's start, the memory estimate, the write-up: a line after the silence while the
    driver says what it is busy with; none once it says it is not (Tune's loop has its own),
    and none after the heartbeat stops."""
    import time

    from raybatch.run.heartbeat import Heartbeat

    caplog.set_level(logging.INFO, logger=LOGGER)

    def said() -> list[str]:
        return [m for m in caplog.messages if m.startswith("still ")]

    with Heartbeat(every_s=0.05) as beat:
        beat.doing("writing up")
        deadline = time.monotonic() + 30.0  # a loaded machine's thread may start late
        while not said() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert said() and said()[0].startswith("still writing up (")
        beat.doing(None)  # returns once any line under way is said whole
        count = len(said())
        time.sleep(0.2)
        assert len(said()) == count
        beat.doing("starting")
    count = len(said())
    time.sleep(0.2)
    assert len(said()) == count  # stopped with the driver's work
