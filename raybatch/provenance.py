"""Where a searched recipe came from: a typed record, written under ``provenance`` in
``best_config.yaml`` and read back field by field.

A :class:`Provenance` is what the search measured of the winner (its runs' times to target,
their spread, its peak memory), on what (the device, the versions, the autocast and clipping
the trials trained under), against what (the runner-up, the simple alternatives, what the
search cost), and whether a retarget has moved it off the measured recipe. Each field has one
name and one type, so training code, the report and the CLI read ``best.provenance.device``
rather than a chain of ``.get()`` on a dict whose keys nobody lists.

What the search cost is a record too (:class:`SearchCost`), as are the comparisons
(:class:`RunnerUp`, :class:`Comparison`: written flat, their knobs beside their verdict) and
the seed points (:class:`~raybatch.keys.KnobPoint`). The time model (``prior``) is kept as the
mapping its own ``to_dict`` writes (:class:`raybatch.timemodel.model.TimeModel` reads it
back): the model stands above this record, which only carries it.

Fields a file does not carry are ``None``; :attr:`Provenance.amp_recorded` tells "the run
trained in fp32" (``amp_dtype: null`` written) from "this file does not say" (no key).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, cast

from raybatch.errors import ConfigError, Issue
from raybatch.keys import RAW_KNOBS, KnobPoint


@dataclass(frozen=True)
class SearchCost:
    """A search's cost.

    Attributes:
        device_s: Seconds the search's trials (and the time model) held their devices.
        train_s: The training seconds among them (the objective's clock).
        unit_s: The time to target the cost is counted in (the winner's median, or the grid's
            best in a benchmark).
        runs: Trials and confirmation runs that held a device.
        wall_s: Wall clock from the first trial's start to the last run's end (``None``: the
            rows do not say when they ran).
        slots: The most runs that held their devices at once: ``slots x wall_s`` is what the
            user paid, the gaps and idle slots between trials included.
        startup_s: One process start per slot (what the first run of each slot's process
            paid once: its start-up, first imports and data, :func:`~raybatch.results.cost.
            slot_startups`): a fixed cost that does not grow with the training, left out of
            :attr:`trainings_wall_warm`.
    """

    device_s: float
    train_s: float
    unit_s: float
    runs: int
    wall_s: float | None = None
    slots: int | None = None
    startup_s: float | None = None

    @property
    def trainings(self) -> float:
        """Device seconds in trainings of the unit recipe."""
        return self.device_s / self.unit_s

    @property
    def trainings_train(self) -> float:
        """Training seconds alone in trainings of the unit recipe."""
        return self.train_s / self.unit_s

    @property
    def trainings_wall(self) -> float | None:
        """Slots x wall clock in trainings of the unit recipe: what the user paid."""
        if self.wall_s is None or self.slots is None:
            return None
        return self.slots * self.wall_s / self.unit_s

    @property
    def trainings_wall_warm(self) -> float | None:
        """:attr:`trainings_wall` less one process start per slot."""
        paid = self.trainings_wall
        if paid is None:
            return None
        return paid - (self.startup_s or 0.0) / self.unit_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "trainings": self.trainings,
                "trainings_train": self.trainings_train, "trainings_wall": self.trainings_wall,
                "trainings_wall_warm": self.trainings_wall_warm}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchCost:
        """The cost :meth:`to_dict` wrote (its trainings are computed again, not read; a cost
        written before the wall clock was measured has none)."""

        def optional(key: str, kind: type) -> Any:
            value = data.get(key)
            return None if value is None else kind(value)

        return cls(float(data["device_s"]), float(data["train_s"]), float(data["unit_s"]),
                   int(data["runs"]), optional("wall_s", float), optional("slots", int),
                   optional("startup_s", float))  # fmt: skip

    def sentence(self, unit: str = "the recipe it found") -> str:
        held = (
            f"its {self.runs} runs held their devices {self.device_s:.0f} s"
            f" ({self.trainings:.1f} trainings; {self.trainings_train:.1f} counting training"
            " seconds alone)"
        )
        paid, warm = self.trainings_wall, self.trainings_wall_warm
        if paid is None or warm is None or self.wall_s is None:
            return f"this search cost {self.trainings:.1f} trainings of {unit}: {held}"
        # A recipe that trains in a second or two makes a process's start-up most of the
        # figure (a template workload: 188 trainings, 34 less the start-ups): said so.
        fixed = ("; most of it the processes' start-up, which a longer training pays once"
                 if paid - warm >= paid / 2 else "")  # fmt: skip
        return (
            f"this search cost {paid:.1f} trainings of {unit} ({self.slots} slot(s) x"
            f" {self.wall_s:.0f} s of wall clock; {warm:.1f} less one process start per slot,"
            f" {self.startup_s or 0.0:.1f} s in all{fixed}); {held}"
        )


@dataclass(frozen=True)
class RetargetVerdict:
    """A retarget's verdict (:meth:`raybatch.BestConfig.retarget`).

    Attributes:
        world_size: The GPU count the recipe was moved to.
        measured: Whether the moved recipe is still the measured one (same effective batch).
        note: Why not, or what changed, in a sentence every export repeats.
        measured_recipe: The measured recipe's batch shape (micro batch, accumulation, world
            size, effective batch).
    """

    world_size: int | None = None
    measured: bool = False
    note: str | None = None
    measured_recipe: dict[str, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _split(data: Any, kind: type, field: str, source: str) -> tuple[KnobPoint, dict[str, Any]]:
    """A flat mapping as the YAML holds it, split into its knobs and ``kind``'s other fields.

    Raises:
        ConfigError: Not a mapping, a key that is neither a knob nor a field, a knob missing,
            or a value not of its field's type (``field`` named, with ``source``).
    """
    types = {f.name: str(f.type) for f in fields(kind)}
    types.pop("knobs")
    if not isinstance(data, Mapping) or set(data) - set(types) - set(RAW_KNOBS):
        why = f"not a {kind.__name__} record (the knobs and {', '.join(sorted(types))})"
        raise ConfigError([Issue(field, why)], source)
    issues = [
        Issue(f"{field}.{k}", "must be a number (every knob is written)")
        for k in RAW_KNOBS
        if not isinstance(data.get(k), int | float) or isinstance(data.get(k), bool)
    ]
    issues += [Issue(f"{field}.{k}", f"must be {types[k]}, got {v!r}")
               for k, v in data.items() if k in types and not _is(v, types[k])]  # fmt: skip
    if issues:
        raise ConfigError(issues, source)
    knobs = cast(KnobPoint, {k: data[k] for k in RAW_KNOBS})
    return knobs, {k: v for k, v in data.items() if k in types}


_TYPES: dict[str, tuple[type, ...]] = {"float": (int, float), "int": (int,), "bool": (bool,),
                                       "str": (str,), "None": (type(None),)}  # fmt: skip


def _is(value: Any, annotation: str) -> bool:
    """Whether ``value`` is of a field's ``annotation`` (``"float | None"``: a number or None;
    a bool is no number)."""
    allowed = tuple(t for part in annotation.split("|") for t in _TYPES[part.strip()])
    number = bool not in allowed and isinstance(value, bool)
    return isinstance(value, allowed) and not number


@dataclass(frozen=True)
class RunnerUp:
    """The second-best recipe against the winner, seed by seed (written flat, its knobs beside
    the verdict).

    Attributes:
        knobs: Its raw knobs.
        paired_ratio: Its time over the winner's, the median over their paired runs (> 1: the
            winner is faster).
        wins: Pairs the winner won.
        pairs: Pairs compared.
        within_noise: Whether the ratio lies inside the indifference zone (called equal).
        indifference: The zone's half-width (0.1: within 10 %).
    """

    knobs: KnobPoint
    paired_ratio: float
    wins: int
    pairs: int
    within_noise: bool
    indifference: float = 0.1

    def to_dict(self) -> dict[str, Any]:
        return {**self.knobs, **{f.name: getattr(self, f.name) for f in fields(self)[1:]}}

    @classmethod
    def from_dict(cls, data: Any, source: str = "<python>") -> RunnerUp:
        knobs, values = _split(data, cls, "provenance.runner_up", source)
        try:
            return cls(knobs, **values)
        except TypeError:
            why = "a runner-up's verdict needs paired_ratio, wins, pairs and within_noise"
            raise ConfigError([Issue("provenance.runner_up", why)], source) from None


BOUNDS = ("measured", "paired", "at_least")
"""How a comparison's ratio was measured: each from a run that reached (``measured``), seed by
seed over the race's pairs (``paired``), or a lower bound from a run stopped before the target
(``at_least``: its training seconds over the winner's time)."""


@dataclass(frozen=True)
class Comparison:
    """The winner against one simple alternative (the largest batch at the rule's LR or at its
    best swept LR, the reference), written flat: its label, knobs and verdict.

    Attributes:
        recipe: The alternative, in words.
        knobs: Its raw knobs.
        status: How its run ended in the search.
        ratio: Its time over the winner's (> 1: the winner is faster); ``None``: no figure.
        bound: One of :data:`BOUNDS`, or ``None`` with ``ratio``.
        is_winner: It is the winner (ratio 1).
        pairs: Paired runs compared (``paired``).
        wins: Pairs the winner won (``paired``).
        within_noise: Whether the paired ratio is inside the indifference zone (``paired``).
        time_to_target_s: Its search run's time to target (``measured``).
        train_s: Its search run's training seconds before it stopped (``at_least``).
        reason: Why there is no figure (``bound`` ``None``).
    """

    recipe: str
    knobs: KnobPoint
    status: str
    ratio: float | None = None
    bound: str | None = None
    is_winner: bool = False
    pairs: int | None = None
    wins: int | None = None
    within_noise: bool | None = None
    time_to_target_s: float | None = None
    train_s: float | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"recipe": self.recipe, **self.knobs, "status": self.status}
        if self.is_winner:
            out["is_winner"] = True
        out.update(ratio=self.ratio, bound=self.bound)
        for name in ("pairs", "wins", "within_noise", "time_to_target_s", "train_s"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.bound is None:
            out["reason"] = self.reason
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str = "<python>", name: str = "?") -> Comparison:
        field = f"provenance.compared.{name}"
        knobs, values = _split(data, cls, field, source)
        if values.get("bound") not in (*BOUNDS, None):
            why = f"bound must be one of {', '.join(BOUNDS)} or null, got {values['bound']!r}"
            raise ConfigError([Issue(field, why)], source)
        try:
            return cls(knobs=knobs, **values)
        except TypeError:
            raise ConfigError(
                [Issue(field, "a comparison needs recipe and status")], source
            ) from None


@dataclass(frozen=True)
class Provenance:
    """Where a searched recipe came from (see the module's docstring).

    Attributes:
        median_time_to_target_s: The median training seconds to target over its judging runs.
        time_to_target_s_runs: Each judging run's training seconds to target.
        spread_s: The largest minus the smallest of them.
        samples_to_target: The median training samples to target.
        peak_memory_bytes: The largest peak GPU memory of its runs.
        device: The hardware the trials ran on (``CPU (...)`` on CPUs).
        amp_dtype: The workload's autocast dtype (``None``: fp32, or not recorded).
        grad_clip_norm: The gradient clipping the trials trained with (``None``: none).
        versions: raybatch, PyTorch, Ray, Optuna and Python, as the search ran them.
        trial_id: The search trial that first ran it.
        space: The space's name (a preset's name lets a retarget re-derive the recipe).
        target: The target it reached, as the search stated it.
        search_trials: Trials the search ran.
        created: When the winner was chosen (local time, ISO 8601).
        runner_up: The second-best recipe's knobs and its paired comparison.
        compared: The winner against the largest batch and the reference, by name.
        search_cost: What the search cost, in trainings of the winner.
        baseline_point: The largest batch that fits, as the search found it (its knobs).
        reference_point: The reference recipe's knobs.
        prior: The time model measured inside the search, where one was.
        retargeted: A retarget's verdict (``None``: the recipe as searched).
        amp_recorded: Whether ``amp_dtype`` was recorded (not written as a field of its own;
            true whenever ``amp_dtype`` is given).
    """

    median_time_to_target_s: float | None = None
    time_to_target_s_runs: list[float] | None = None
    spread_s: float | None = None
    samples_to_target: float | None = None
    peak_memory_bytes: int | None = None
    device: str | None = None
    amp_dtype: str | None = None
    grad_clip_norm: float | None = None
    versions: dict[str, str] | None = None
    trial_id: str | None = None
    space: str | None = None
    target: str | None = None
    search_trials: int | None = None
    created: str | None = None
    runner_up: RunnerUp | None = None
    compared: dict[str, Comparison] | None = None
    search_cost: SearchCost | None = None
    baseline_point: KnobPoint | None = None
    reference_point: KnobPoint | None = None
    prior: dict[str, Any] | None = None
    retargeted: RetargetVerdict | None = None
    amp_recorded: bool = False

    def __post_init__(self) -> None:
        if self.amp_dtype is not None and not self.amp_recorded:  # a dtype given is recorded
            object.__setattr__(self, "amp_recorded", True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<python>") -> Provenance:
        """The record a ``provenance`` mapping holds (a file's, or one written by hand).

        Raises:
            ConfigError: A key that is no field of the record (named, with ``source``).
        """
        names = {f.name for f in fields(cls)} - {"amp_recorded"}
        unknown = sorted(set(data) - names)
        if unknown:
            why = f"unknown field (the fields: {', '.join(sorted(names))})"
            raise ConfigError([Issue(f"provenance.{k}", why) for k in unknown], source)
        values = dict(data)
        moved = values.get("retargeted")
        if moved is not None:
            known = {f.name for f in fields(RetargetVerdict)}
            if not isinstance(moved, Mapping) or set(moved) - known:
                why = f"not a retarget's record (its fields: {', '.join(sorted(known))})"
                raise ConfigError([Issue("provenance.retargeted", why)], source)
            values["retargeted"] = RetargetVerdict(**moved)
        if values.get("runner_up") is not None:
            values["runner_up"] = RunnerUp.from_dict(values["runner_up"], source)
        compared = values.get("compared")
        if compared is not None:
            if not isinstance(compared, Mapping):
                raise ConfigError([Issue("provenance.compared", "not a mapping")], source)
            values["compared"] = {
                str(k): Comparison.from_dict(v, source, str(k)) for k, v in compared.items()
            }
        cost = values.get("search_cost")
        if cost is not None:
            try:
                values["search_cost"] = SearchCost.from_dict(cost)
            except (KeyError, TypeError, ValueError):
                why = "not a search's cost (device_s, train_s, unit_s, runs)"
                raise ConfigError([Issue("provenance.search_cost", why)], source) from None
        return cls(**values, amp_recorded="amp_dtype" in data)

    def to_dict(self) -> dict[str, Any]:
        """The mapping written under ``provenance``: every field that says something (``None``
        left out, but an fp32 run's recorded ``amp_dtype: null``)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "amp_recorded" or (value is None and f.name != "amp_dtype"):
                continue
            if f.name == "amp_dtype" and not self.amp_recorded:
                continue
            if f.name == "compared":
                value = {k: c.to_dict() for k, c in value.items()}
            elif isinstance(value, RetargetVerdict | SearchCost | RunnerUp):
                value = value.to_dict()
            out[f.name] = value
        return out

    @property
    def measured(self) -> bool:
        """Whether the recipe is the one the search measured (a retarget may have re-derived
        it)."""
        return self.retargeted is None or self.retargeted.measured

    def measured_on(self) -> Provenance:
        """What the trial rows cannot say, and a winner chosen again from them keeps: the
        device, autocast, clipping, seed points and time model (:func:`choose_winner`)."""
        kept = ("device", "amp_dtype", "grad_clip_norm", "baseline_point", "reference_point")
        return Provenance(
            **{k: getattr(self, k) for k in kept}, prior=self.prior, amp_recorded=self.amp_recorded
        )


__all__ = ["BOUNDS", "Comparison", "Provenance", "RetargetVerdict", "RunnerUp", "SearchCost"]
