"""The confirmation's record: each race run in an Optuna study beside the search's.

The race (:mod:`raybatch.tuning.confirmation`) is not the search: its runs are not asked of TPE,
and telling them to the search's study would teach the sampler from seeds it never chose. They
go to a study of their own beside it (:data:`CONFIRMATION_STUDY`), one Optuna trial per run,
so that optuna-dashboard shows the race too, each with the parameters of the search trial that
measured its recipe first.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any

from raybatch import keys
from raybatch.results.rows import TrialRow
from raybatch.status import TrialStatus
from raybatch.tuning.study import (
    CONFIG_ATTR,
    REASON_ATTR,
    STATUS_ATTR,
    TIME_TO_TARGET_ATTR,
    TUNE_TRIAL_ID_ATTR,
    SearchStudy,
)

if TYPE_CHECKING:
    import optuna

CONFIRMATION_STUDY = "{}-confirmation"
"""The name of the study beside the search's (``{}``: the search study's) holding the
confirmation's race runs: one Optuna trial per run, so optuna-dashboard lists them too."""
SEED_ATTR = keys.SEED
"""A confirmation run's seed."""
SEARCH_TRIAL_ATTR = "search_trial_id"
"""A confirmation run's recipe: the Ray Tune trial of the search that measured it first."""


def race_seed(config: dict[str, Any] | None) -> int | None:
    """The seed of a confirmation run's Tune config (it carries its candidate and seed:
    :class:`~raybatch.tuning.confirmation.RaceSearcher`); ``None`` for a search trial."""
    if not config or keys.CANDIDATE not in config or config.get(keys.SEED) is None:
        return None
    return int(config[keys.SEED])


class RaceRecord:
    """The race's runs, recorded in the study beside ``record``'s as each ends."""

    def __init__(self, record: SearchStudy) -> None:
        self.record = record
        self._study: optuna.Study | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles the race's searcher whole; the study is reopened from the URL after.
        return {**self.__dict__, "_study": None}

    def start(self) -> None:
        """A race starts: the study beside holds its runs only (a race interrupted in a run
        resumed is continued, its runs kept: this is called once per race)."""
        import optuna

        self._study = None
        storage = self.record.storage_url or self.record.memory_storage
        if storage is None:  # an in-memory study never opened: nothing ran
            return
        with contextlib.suppress(KeyError):  # no race ran before
            optuna.delete_study(study_name=self._name, storage=storage)

    @property
    def _name(self) -> str:
        return CONFIRMATION_STUDY.format(self.record.study_name)

    def add(self, row: TrialRow, search_trial_id: str | None, curve: dict[int, float]) -> None:
        """Record one run: COMPLETE with its time to target where it reached, PRUNED where it
        was stopped before (capped at the slack of the leader's time on its seed, or at the
        time cap), FAIL otherwise; its recipe's parameters are those of the search trial that
        measured it first, its evaluations (``curve``: samples seen -> target metric) its
        intermediate values, its seed and status user attributes."""
        import optuna

        if self._study is None:
            self._study = optuna.create_study(
                storage=self.record.storage_url or self.record.memory_storage,
                study_name=self._name,
                direction="minimize",
                load_if_exists=True,
            )
        searched = [
            t
            for t in self.record.study.get_trials(deepcopy=False)
            if search_trial_id is not None
            and t.user_attrs.get(TUNE_TRIAL_ID_ATTR) == search_trial_id
        ]
        reached = row.status is TrialStatus.REACHED and row.time_to_target_s is not None
        stopped = row.status in (TrialStatus.CAPPED, TrialStatus.CENSORED)
        state = "COMPLETE" if reached else "PRUNED" if stopped else "FAIL"
        attrs = {
            STATUS_ATTR: row.status.value,
            REASON_ATTR: row.reason,
            SEED_ATTR: row.seed,
            SEARCH_TRIAL_ATTR: search_trial_id,
            TUNE_TRIAL_ID_ATTR: row.trial_id,
            TIME_TO_TARGET_ATTR: row.time_to_target_s,
            keys.MEET_LEVEL: row.meet_level,  # where set, the time above is to this level
            CONFIG_ATTR: row.config.to_dict(),
        }
        self._study.add_trial(
            optuna.trial.create_trial(
                state=optuna.trial.TrialState[state],
                value=row.time_to_target_s if reached else None,
                params=dict(searched[-1].params) if searched else {},
                distributions=dict(searched[-1].distributions) if searched else {},
                user_attrs={k: v for k, v in attrs.items() if v is not None},
                intermediate_values={int(k): float(v) for k, v in curve.items()},
            )
        )


class RaceCaps:
    """The confirmation's runs, capped per seed: past ``slack`` x the first run on its seed to
    reach, a run cannot win its pair. The race never moves the search's ``B``.

    Args:
        slack: The scheduler's multiple of the best time.
    """

    def __init__(self, slack: float) -> None:
        self.slack = slack
        self.best_s: dict[int, float] = {}
        """Confirmation seed -> the first (fastest) time to target of a run on it."""

    def reached(self, seed: int, time_to_target_s: float) -> None:
        """A run on ``seed`` reached the target in ``time_to_target_s`` of training."""
        self.best_s[seed] = min(self.best_s.get(seed, math.inf), time_to_target_s)

    def cap_s(self, seed: int) -> float | None:
        """The training time past which a run on ``seed`` is stopped (None before one reached)."""
        best = self.best_s.get(seed)
        return None if best is None else self.slack * best


__all__ = [
    "CONFIRMATION_STUDY", "SEARCH_TRIAL_ATTR", "SEED_ATTR", "RaceCaps", "RaceRecord", "race_seed",
]  # fmt: skip
