"""Connecting to Ray: a local instance, or a cluster at an address that must answer.

``ray.init(address="host:port")`` with nothing listening keeps retrying for minutes before it
gives up. A search aimed at a wrong address should fail in seconds, before it writes anything,
so :func:`check_address` first opens a plain TCP connection to the address (the GCS port, or
the Ray Client port of ``ray://``) with a short timeout.
"""

from __future__ import annotations

import os
import signal
import socket
import threading

from raybatch.cluster.orphans import watch_local_ray
from raybatch.errors import ClusterUnreachableError, RayStartError, first_line

CONNECT_TIMEOUT_S = 5.0


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host:port`` / ``ray://host:port``; None for ``auto``/``local``."""
    text = address.removeprefix("ray://")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def check_address(address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast when nothing listens at ``address`` (``None``, ``auto``, ``local``: skipped).

    Raises:
        ClusterUnreachableError: The connection is refused, times out or the host is unknown.
    """
    if address is None:
        return
    target = _host_port(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout_s):
            return
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        if isinstance(exc, TimeoutError | socket.timeout):
            why = f"no answer in {timeout_s:g} s"
        raise ClusterUnreachableError(
            f"no Ray cluster answers at {address} ({why}); start one with `ray start --head`,"
            " or leave --address out to run on a local Ray"
        ) from None


LOCAL_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}
"""Ray's settings for a Ray this process starts (a cluster's own are its operator's)."""


def _why(exc: Exception) -> str:
    """What a failed local start most likely means, for the one line that says it."""
    if isinstance(exc, OSError) and exc.filename:  # a file of its session it cannot write
        return " (Ray's temporary folder: RAY_TMPDIR, or the system's temporary folder)"
    if "timed out" in str(exc):
        return (
            " (its processes did not come up within Ray's 30 s: the machine may be too busy;"
            " try again when it is less loaded)"
        )
    return ""


def init_ray(address: str | None) -> bool:
    """Connect to ``address`` (default: start a Ray of our own); a no-op when Ray is already up.

    Returns whether this call connected (so the caller may shut down what it started, and
    never a Ray its user started).

    Raises:
        ClusterUnreachableError: Nothing answers at the address.
        RayStartError: A Ray of our own could not start here (what it had started is shut down).
    """
    import ray

    if ray.is_initialized():
        return False
    # No address means a Ray of our own ("local"), never whichever Ray happens to run on this
    # machine; RAY_ADDRESS, Ray's own way to name a cluster, is honoured.
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    check_address(address)
    before = signal.getsignal(signal.SIGTERM)
    # A Ray of our own starts no idle workers for the driver: a search's trials ran in processes
    # started for them while the two prestarted ones were ended unused (each about 2 s of a
    # core, which the first trials waited behind on a small machine).
    system = LOCAL_SYSTEM_CONFIG if address == "local" else None
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 _system_config=system)  # fmt: skip
    except ConnectionError as exc:
        raise ClusterUnreachableError(
            f"no Ray cluster answers at {address}: {first_line(exc)}"
        ) from None
    except Exception as exc:  # Ray raises a bare Exception when its node times out
        if address != "local":
            raise
        ray.shutdown()  # the processes it had started before it failed
        raise RayStartError(
            f"a local Ray could not start: {first_line(exc)}{_why(exc)}; nothing ran: once Ray"
            " can start here, run the command again"
        ) from None
    if address == "local":  # its processes: none may outlive a driver killed outright
        watch_local_ray(os.path.dirname(ray.__file__))
    if callable(before) and threading.current_thread() is threading.main_thread():
        # Ray's core worker answers SIGTERM with a C++ stack dump and an abort; a handler the
        # driver's Python had (raybatch.run.signals: taken as Ctrl-C) stays.
        signal.signal(signal.SIGTERM, before)
    return True
