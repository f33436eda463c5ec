"""What ends a trial, as the reason a user reads, without a clock or a loop."""

from __future__ import annotations

import pytest
import torch

from raybatch import Target
from raybatch.status import TrialStatus
from raybatch.trial.limits import TrialLimits, failure

LIMITS = TrialLimits(Target(0.9), max_time_s=5.0, max_samples=1000, divergence_factor=10.0)


def test_a_loss_diverges_when_not_finite_or_past_the_factor_times_the_first() -> None:
    assert LIMITS.diverged(2.0, None, 1) is None  # the first loss sets the scale
    assert LIMITS.diverged(29.0, 3.0, 7) is None
    assert LIMITS.diverged(31.0, 3.0, 7) == "loss 31 exceeds 10 x the initial 3 at step 7"
    assert LIMITS.diverged(float("nan"), 3.0, 7) == "loss is nan at step 7"


def test_a_budget_is_spent_past_the_time_cap_or_at_the_sample_budget() -> None:
    assert LIMITS.spent(5.0, 999) is None
    assert LIMITS.spent(5.1, 10) == (
        "time cap of 5 s of training reached at 10 samples without reaching accuracy 0.9"
    )
    assert LIMITS.spent(1.0, 1000) == "sample budget of 1000 spent without reaching accuracy 0.9"


def test_the_objective_is_the_time_to_target_or_ten_times_the_cap() -> None:
    assert LIMITS.objective(TrialStatus.REACHED, 3.5) == 3.5
    assert LIMITS.objective(TrialStatus.CENSORED, None) == 50.0


@pytest.mark.parametrize(
    ("exc", "status", "with_traceback"),
    [
        (torch.cuda.OutOfMemoryError("CUDA out of memory."), TrialStatus.INFEASIBLE_MEMORY, False),
        (KeyError("features"), TrialStatus.ERROR, True),
    ],
)
def test_an_out_of_memory_error_is_infeasible_and_any_other_an_error_with_its_traceback(
    exc: BaseException, status: TrialStatus, with_traceback: bool
) -> None:
    got, reason, traceback = failure(exc, "while training")
    assert got is status and (traceback is not None) == with_traceback
    assert reason in ("out of memory while training: CUDA out of memory.",
                      "KeyError: 'features' (while training)")  # fmt: skip
