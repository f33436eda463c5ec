"""Exceptions raised by raybatch.

Every error a user can cause by bad input names *where* the input came from (a file
path, or ``<python>`` for objects built in code), *which field* is wrong and *what is
allowed*, so that the CLI can print it without a traceback and the user can fix the file
without reading our source. The layout follows ``optuna/exceptions.py``: one base class,
one subclass per kind of failure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class RaybatchError(Exception):
    """Base class of every error raised on purpose by raybatch."""


@dataclass(frozen=True)
class Issue:
    """One problem with one field of an input.

    Attributes:
        field: Dotted path of the field (``reference.lr``, ``search.micro_batch_size[2]``).
        message: What is wrong and what is allowed.
        line: 1-based line in the source file, when the input came from a file.
    """

    field: str
    message: str
    line: int | None = None


def render_issues(issues: Sequence[Issue], source: str) -> str:
    """One line per issue: ``source[:line]: field: message``."""
    lines = []
    for issue in issues:
        where = source if issue.line is None else f"{source}:{issue.line}"
        lines.append(f"{where}: {issue.field}: {issue.message}")
    return "\n".join(lines)


class InputError(RaybatchError, ValueError):
    """Bad user input: a space file, a space built in Python, or knobs given to ``derive``.

    It is a ``ValueError`` too, so callers that already guard against bad values with
    ``except ValueError`` keep working.

    Attributes:
        issues: Every problem found (validation reports all of them, not just the first).
        source: Where the input came from: a file path or ``<python>``.
    """

    def __init__(self, issues: Sequence[Issue], source: str = "<python>") -> None:
        self.issues = tuple(issues)
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        return render_issues(self.issues, self.source)

    def located(self, source: str, locate: Callable[[str], int | None] | None = None) -> InputError:
        """The same error, attributed to ``source`` with line numbers from ``locate``."""
        issues = [
            Issue(i.field, i.message, i.line if locate is None else locate(i.field))
            for i in self.issues
        ]
        return type(self)(issues, source)

    def renamed(self, names: Mapping[str, str], source: str) -> InputError:
        """The same error, its fields named as the caller knows them (``trials`` ->
        ``--trials``), attributed to ``source``."""
        issues = [Issue(names.get(i.field, i.field), i.message, i.line) for i in self.issues]
        return type(self)(issues, source)


class SpaceError(InputError):
    """A search-space declaration (YAML file or Python object) is invalid."""


class ConfigError(InputError):
    """Raw knobs given to :meth:`raybatch.SearchSpace.derive` do not make a valid recipe."""


class PresetNotFoundError(RaybatchError, LookupError):
    """A space was named that is neither a bundled preset nor an existing file."""


class BudgetUnavailableError(RaybatchError):
    """No memory budget can be known: no explicit budget was given and NVML cannot be used."""


class WorkloadError(RaybatchError):
    """A workload reference cannot be imported, or the object found is not a workload."""


class TraceError(RaybatchError):
    """The memory trace of a training step failed (data-dependent control flow, custom ops).

    Attributes:
        op: The operator or construct that could not be traced, when known.
        cause: The original exception.
    """

    def __init__(self, message: str, op: str | None, cause: BaseException) -> None:
        super().__init__(message)
        self.op = op
        self.cause = cause


class RunDirError(InputError):
    """A run directory (or a file in it) is missing, incomplete or not a raybatch run."""


class RunLockedError(RunDirError):
    """Another driver (``raybatch search`` or ``resume``) holds the run directory's lock."""


class NothingFitsError(RaybatchError):
    """Not even the space's smallest recipe fits the memory budget: there is nothing to search."""


class OptionError(InputError):
    """A value given to a command or a call that it cannot take: an option (``gpus_per_trial``,
    ``--format``), a target (``accuracy>=0.97``), a size (``--memory-budget 8GiB``), or an
    output file that exists already (raybatch never overwrites). One class: no caller handles
    these differently, and the issue names the field."""


class UnknownSettingError(OptionError, TypeError):
    """A keyword a raybatch function does not take (``max_time`` for ``max_time_s``), named
    with the one it most likely meant; a ``TypeError`` too, as Python's own for an unexpected
    keyword, so ``except TypeError`` still catches it."""


class NotATrainableError(OptionError, TypeError):
    """A function given where one made by :func:`raybatch.trainable` is needed (its settings,
    space and penalty are read from it); a ``TypeError`` too, as for a wrong argument type."""


class SearchInterrupted(RaybatchError):
    """The search was stopped (Ctrl-C, SIGINT) before its trials finished; it can be resumed."""


class DiskFullError(RaybatchError):
    """A file of the run could not be written for want of space (a full disk, a quota): the
    search stopped; what was written before is kept, and it resumes once space is freed."""


class TrialsFailedError(RaybatchError):
    """Trials failed for a reason no recipe changes (the workload cannot be built or loaded
    in a Ray worker); the search stopped early instead of spending its budget on it."""


class ClusterUnreachableError(RaybatchError):
    """No Ray cluster answers at the address given (``--address``)."""


class RayStartError(RaybatchError):
    """The Ray a search starts for itself could not start on this machine (its temporary
    folder cannot be made, or its processes did not come up in Ray's 30 s)."""


class TrialDeviceError(RaybatchError):
    """Ray gave a trial a GPU that its process cannot use (a torch without CUDA there)."""


class WorkerMemoryError(RaybatchError):
    """A data-parallel worker's recipe does not fit its GPU: its probe said so, or it ran out
    of memory while training. Raised inside the worker so that Ray Train stops every rank (a
    rank that returned would leave the others waiting in their next all-reduce); the Tune trial
    reads it back and ends as ``infeasible_memory``."""


class WorkerLostError(RaybatchError):
    """A trial lost its process (a data-parallel worker's process or node died, or the process
    Tune reused was left broken by an earlier trial): not the recipe's fault, so it is raised
    into Ray Tune, which runs the trial again up to ``max_failures`` times, as it does a single
    trial whose worker died."""


class ExportError(InputError):
    """The winner cannot be written for the training framework asked for, as measured: an
    optimizer the framework does not offer, or a world size the recipe cannot be moved to."""
