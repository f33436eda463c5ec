"""What a data-parallel run's failure was: a rank out of memory, or a worker lost.

Ray Train returns a failed run as its own error around what each rank raised (per-rank
failures, a controller's failure, a task error's cause), and at times with a rank's exception
only as text: these read all of it, so that the trial ends ``infeasible_memory`` for memory,
is retried by Tune for a lost node, and ends ``error`` for a fault of the recipe.
"""

from __future__ import annotations

from raybatch.errors import WorkerMemoryError, first_line
from raybatch.memory.probe import is_out_of_memory


def failures(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it wraps: a Ray Train worker group's per-rank failures, a controller's
    failure, Ray task errors' causes, and ``__cause__`` chains."""
    seen: list[BaseException] = []
    unread = [exc]
    while unread:
        e = unread.pop()
        if any(e is s for s in seen):
            continue
        seen.append(e)
        unread.extend(getattr(e, "worker_failures", {}).values())
        for attr in ("controller_failure", "cause", "__cause__"):
            inner = getattr(e, attr, None)
            if isinstance(inner, BaseException):
                unread.append(inner)
    return seen


def memory_failure(exc: BaseException) -> str | None:
    """The reason when a data-parallel run failed for memory on some rank, else ``None``."""
    seen = failures(exc)
    for e in seen:
        if isinstance(e, WorkerMemoryError) or is_out_of_memory(e):
            return first_line(e)
    # A worker's exception may come back only as text inside a Ray error: find its line.
    for e in seen:
        for line in str(e).splitlines():
            for name in (WorkerMemoryError.__name__, "OutOfMemoryError"):
                if f"{name}: " in line:
                    return line.split(f"{name}: ", 1)[1].strip()
    return None


def lost_worker(exc: BaseException) -> str | None:
    """The reason when a data-parallel run failed because a worker's actor, process or node
    died (Ray's own errors, anywhere in what ``exc`` wraps), else ``None``."""
    from ray import exceptions as ray_errors

    lost = (ray_errors.RayActorError, ray_errors.NodeDiedError, ray_errors.WorkerCrashedError,
            ray_errors.LocalRayletDiedError)  # fmt: skip
    for e in failures(exc):
        if isinstance(e, lost):
            return f"{type(e).__name__}: {first_line(e)}"
    return None


__all__ = ["failures", "lost_worker", "memory_failure"]
