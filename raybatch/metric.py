"""The validation metrics a workload reports, the target a search aims at, and their check.

A target is only reachable if it names a metric the workload reports, in that metric's
direction, inside its range. ``--target 97`` against an accuracy in [0, 1] would let every
trial run to its time cap and end the search with "no candidate reached the target": the whole
budget spent on a typo. :func:`check_target` rejects it before any trial starts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from raybatch.errors import Issue, OptionError, WorkloadError


@dataclass(frozen=True)
class Metric:
    """A validation metric of a workload.

    Attributes:
        name: What ``evaluate`` calls it, and what a target names (``accuracy``, ``loss``).
        mode: ``max`` (higher is better) or ``min``.
        low: Smallest possible value (``None``: unbounded).
        high: Largest possible value (``None``: unbounded).

    Example::

        import torch
        import raybatch
        from raybatch.examples.digits import DigitsWorkload

        class DigitsByLoss(DigitsWorkload):
            metrics = (raybatch.Metric("loss", "min", low=0.0),)

            @torch.no_grad()
            def evaluate(self, model, batches):  # a number: the value of the first metric
                losses = [torch.nn.functional.cross_entropy(model(x), y).item() for x, y in batches]
                return sum(losses) / len(losses)

        fn = raybatch.trainable(DigitsByLoss(), "digits_cnn_sgd", "loss<=0.3", max_time_s=60)
    """

    name: str
    mode: str = "max"
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        where = f"Metric({self.name!r})"
        if self.mode not in ("max", "min"):
            raise OptionError(
                [Issue(f"{where}.mode", f"must be 'max' or 'min', got {self.mode!r}")]
            )
        if not self.name.isidentifier():
            raise OptionError([Issue(f"{where}.name", "must be an identifier")])

    def describe(self) -> str:
        better = "higher" if self.mode == "max" else "lower"
        low = "-inf" if self.low is None else f"{self.low:g}"
        high = "inf" if self.high is None else f"{self.high:g}"
        return f"{self.name} ({better} is better, {low}..{high})"


def _target_field(source: str) -> str:
    """How an error names the target: the CLI option, or the argument of a Python call."""
    return "--target" if source == "command line" else "target"


@dataclass(frozen=True)
class Target:
    """The validation metric value a trial must reach.

    Attributes:
        value: The threshold.
        mode: ``max`` (reach ``metric >= value``, e.g. accuracy) or ``min`` (``metric <= value``,
            e.g. loss or perplexity).
        metric: The metric's name, for messages and reports.

    Example::

        import raybatch
        from raybatch.examples.digits import workload

        target = raybatch.Target.parse("accuracy>=0.97")  # the same as raybatch.Target(0.97)
        target.reached(0.975)  # True
        fn = raybatch.trainable(workload, "digits_cnn_sgd", target, max_time_s=60)
    """

    value: float
    mode: str = "max"
    metric: str = "accuracy"

    def __post_init__(self) -> None:
        if self.mode not in ("max", "min"):
            message = f"mode must be 'max' or 'min', got {self.mode!r}"
            raise OptionError([Issue("target", message)])
        if not math.isfinite(self.value):
            raise OptionError([Issue("target", f"value must be finite, got {self.value}")])

    @classmethod
    def parse(cls, text: str, source: str = "<python>") -> Target:
        """``"accuracy>=0.97"``, ``"loss<=0.3"`` or a bare ``"0.97"`` (higher is better).

        Args:
            text: The target as written.
            source: Where it was written, for the error: ``"command line"`` (the field is then
                ``--target``) or ``<python>``.

        Raises:
            OptionError: Anything else, naming what is allowed.
        """
        raw = text.strip()
        for op, mode in ((">=", "max"), ("<=", "min")):  # noqa: B007 (mode is read after)
            name, sep, value = raw.partition(op)
            if sep:
                break
        else:
            name, value, mode = "accuracy", raw, "max"
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not name.strip() or not name.strip().isidentifier() or not math.isfinite(number):
            raise OptionError(
                [
                    Issue(
                        _target_field(source),
                        f"must be METRIC>=VALUE, METRIC<=VALUE or VALUE, got {text!r}",
                    )
                ],
                source,
            )
        return cls(number, mode, name.strip())

    def __str__(self) -> str:
        return f"{self.metric}{'>=' if self.mode == 'max' else '<='}{self.value:g}"

    def reached(self, metric: float) -> bool:
        if not math.isfinite(metric):
            return False
        return metric >= self.value if self.mode == "max" else metric <= self.value


ACCURACY = Metric("accuracy", "max", 0.0, 1.0)
"""The default: classification accuracy, a fraction."""


def metrics_named(given: Iterable[Metric | str], who: str) -> tuple[Metric, ...]:
    """Metrics given as :class:`Metric` objects or names (a name: higher is better, unless it
    has ``loss`` in it), for workloads that take them as arguments (the adapters).

    Raises:
        WorkloadError: None given: a target needs one to aim at.
    """
    out = tuple(m if isinstance(m, Metric) else Metric(m, "min" if "loss" in m.lower() else "max")
                for m in given)  # fmt: skip
    if not out:
        raise WorkloadError(f"{who} needs at least one metric to aim at")
    return out


def primary_target(value: float, metrics: Sequence[Metric]) -> Target:
    """A bare number as a target: the workload's first metric, in its direction."""
    first = metrics[0] if metrics else ACCURACY
    return Target(float(value), first.mode, first.name)


def resolve_target(
    target: Target | float | str, metrics: Sequence[Metric], source: str = "<python>"
) -> Target:
    """A checked target from a :class:`Target`, a bare number or text (``loss<=0.35``).

    A bare number (``0.97``, ``"0.97"``) means the workload's first metric, in its direction.

    Raises:
        OptionError: The text cannot be parsed, or :func:`check_target` refuses the target.
    """
    if isinstance(target, Target):
        resolved = target
    elif isinstance(target, str) and (">=" in target or "<=" in target):
        resolved = Target.parse(target, source)
    else:
        value = Target.parse(target, source).value if isinstance(target, str) else float(target)
        resolved = primary_target(value, metrics)
    check_target(resolved, metrics, source)
    return resolved


def check_target(target: Target, metrics: Sequence[Metric], source: str = "<python>") -> None:
    """Reject a target no trial can meaningfully reach, before any trial starts.

    Raises:
        OptionError: The metric is not one the workload reports, the direction is the
            metric's opposite, or the value lies outside the metric's range (a percentage
            given for a fraction gets a "did you mean" hint).
    """
    field = _target_field(source)
    by_name = {m.name: m for m in metrics}
    metric = by_name.get(target.metric)
    if metric is None:
        known = ", ".join(m.describe() for m in metrics)
        raise OptionError(
            [Issue(field, f"the workload reports no metric {target.metric!r}; it reports {known}")],
            source,
        )
    op = ">=" if metric.mode == "max" else "<="
    if target.mode != metric.mode:
        raise OptionError(
            [
                Issue(
                    field,
                    f"{target} asks {metric.name} to go the wrong way: it is"
                    f" {'higher' if metric.mode == 'max' else 'lower'}-is-better; write"
                    f" {metric.name}{op}{target.value:g}",
                )
            ],
            source,
        )
    low = -math.inf if metric.low is None else metric.low
    high = math.inf if metric.high is None else metric.high
    if low <= target.value <= high:
        return
    hint = ""
    if metric.high == 1.0 and 1.0 < target.value <= 100.0:
        hint = f"; did you mean {metric.name}{op}{target.value / 100:g}?"
    raise OptionError(
        [
            Issue(
                field,
                f"{target.value:g} is outside the range of {metric.describe()}{hint}",
            )
        ],
        source,
    )


def metric_values(
    result: float | Mapping[str, float], metrics: Sequence[Metric]
) -> dict[str, float]:
    """What ``Workload.evaluate`` returned, as ``{name: value}``.

    A bare number is the first metric's value.

    Raises:
        WorkloadError: ``evaluate`` returned something else.
    """
    if isinstance(result, Mapping):
        return {str(k): float(v) for k, v in result.items()}
    if isinstance(result, int | float) or hasattr(result, "__float__"):
        first = metrics[0] if metrics else ACCURACY
        return {first.name: float(result)}
    raise WorkloadError(
        f"evaluate() must return a number or a mapping of metric names to numbers, got"
        f" {type(result).__name__}"
    )


def target_value(values: Mapping[str, float], name: str) -> float:
    """The value of the target's metric among what ``evaluate`` returned.

    Raises:
        WorkloadError: ``evaluate`` did not return that metric.
    """

    if name not in values:
        raise WorkloadError(
            f"evaluate() returned {sorted(values)}, not the target's metric {name!r}"
        )
    return values[name]
