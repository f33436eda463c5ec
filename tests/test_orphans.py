"""The watch that ends a local Ray's processes once its driver has ended, however it ended."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from raybatch.cluster.orphans import workers_of

SLEEPER = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(120)\n"
DRIVER = """import subprocess, sys, time
agent = subprocess.Popen([sys.executable, sys.argv[1]])
mine = subprocess.Popen([sys.executable, sys.argv[2]])
print(agent.pid, mine.pid, flush=True)
time.sleep(120)
"""


def _gone(pid: int, within_s: float) -> bool:
    """Whether ``pid`` has ended within ``within_s`` (a zombie reaped by its new parent)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return True
        time.sleep(0.1)
    return False


def test_the_watch_kills_the_drivers_ray_descendants_once_its_pipe_closes_and_only_those(
    tmp_path: Path,
) -> None:
    """A driver's Ray agent that ignores SIGTERM is killed once the driver has ended; the
    driver's other children, and a Ray process of another driver in the same process group
    (a test runner's workers, a shell's background jobs), are left alone."""
    ray_dir = tmp_path / "site-packages" / "ray"
    ray_dir.mkdir(parents=True)
    (ray_dir / "agent.py").write_text(SLEEPER)
    (tmp_path / "user.py").write_text(SLEEPER)
    (tmp_path / "driver.py").write_text(DRIVER)
    driver = subprocess.Popen(
        [sys.executable, str(tmp_path / "driver.py"), str(ray_dir / "agent.py"),
         str(tmp_path / "user.py")], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    bystander = subprocess.Popen([sys.executable, str(ray_dir / "agent.py")])
    assert driver.stdout is not None
    agent, mine = (int(pid) for pid in driver.stdout.readline().split())
    watch = subprocess.Popen(
        [sys.executable, "-m", "raybatch.cluster.orphans", str(driver.pid), str(ray_dir)],
        stdin=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        assert watch.stdin is not None
        time.sleep(2.0)  # it has noted the driver's descendants
        assert not _gone(agent, 0.1)  # the driver's pipe is open: nothing is touched
        driver.kill()  # kill -9 of the driver: its agent lingers...
        driver.wait()
        assert not _gone(agent, 0.5)
        watch.stdin.close()  # ...until the watch sees the driver's end
        assert watch.wait(timeout=60) == 0
        assert _gone(agent, 30)
        assert not _gone(mine, 0.1)  # not Ray's
        assert bystander.poll() is None  # Ray's, but another driver's
    finally:
        for pid in (agent, mine):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        bystander.kill()
        bystander.wait()


RAYLET = """import os, subprocess, sys, time
from pathlib import Path
while not Path(sys.argv[2]).exists():
    time.sleep(0.05)
worker = subprocess.Popen([sys.executable, sys.argv[1]],
                          env={**os.environ, "RAY_RAYLET_PID": str(os.getpid())})
print(worker.pid, flush=True)
"""
LATE_DRIVER = """import subprocess, sys
raylet = subprocess.Popen([sys.executable] + sys.argv[1:])
raylet.wait()
input()
"""


def test_a_worker_the_raylet_started_as_the_driver_died_is_killed_though_handed_to_init(
    tmp_path: Path,
) -> None:
    """A worker the raylet starts between the watch's notes, whose raylet then dies, is no
    longer the driver's descendant (init took it): the watch finds it by the raylet's pid in
    its environment, and kills it; a Ray process naming another raylet is left alone."""
    ray_dir = tmp_path / "site-packages" / "ray"
    ray_dir.mkdir(parents=True)
    (ray_dir / "worker.py").write_text(SLEEPER)
    (ray_dir / "raylet.py").write_text(RAYLET)
    (tmp_path / "driver.py").write_text(LATE_DRIVER)
    go = tmp_path / "go"
    driver = subprocess.Popen(
        [sys.executable, str(tmp_path / "driver.py"), str(ray_dir / "raylet.py"),
         str(ray_dir / "worker.py"), str(go)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    bystander = subprocess.Popen(
        [sys.executable, str(ray_dir / "worker.py")],
        env={**os.environ, "RAY_RAYLET_PID": str(driver.pid + 100000)},
    )  # fmt: skip
    watch = subprocess.Popen(
        [sys.executable, "-m", "raybatch.cluster.orphans", str(driver.pid), str(ray_dir)],
        stdin=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    worker = 0
    try:
        assert watch.stdin is not None and driver.stdout is not None
        time.sleep(2.0)  # it has noted the driver's raylet
        go.touch()  # the raylet starts a worker and dies: init takes the worker
        worker = int(driver.stdout.readline())
        driver.kill()
        driver.wait()
        assert not _gone(worker, 0.5)
        watch.stdin.close()
        assert watch.wait(timeout=60) == 0
        assert _gone(worker, 30)
        assert bystander.poll() is None
    finally:
        if worker:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)
        bystander.kill()
        bystander.wait()


def test_workers_of_a_raylet_are_found_by_the_pid_in_their_environment(tmp_path: Path) -> None:
    """The trials' workers of a Ray whose raylet is gone are found by ``RAY_RAYLET_PID``, which
    Ray sets in their environment; another Ray's workers, and processes without it, are not."""
    for pid, environ in ((101, b"A=1\0RAY_RAYLET_PID=77\0"), (102, b"RAY_RAYLET_PID=770\0"),
                         (103, b"HOME=/\0"), (104, b"RAY_RAYLET_PID=77")):  # fmt: skip
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "environ").write_bytes(environ)
    (tmp_path / "105").mkdir()  # ended meanwhile: no environ to read
    assert sorted(workers_of(77, tmp_path)) == [101, 104]


def test_a_command_ends_with_its_status_and_every_line_it_wrote() -> None:
    """The console script ends without the interpreter's teardown, and loses nothing of
    what it said: buffered output (a pipe, not a terminal) and its log are flushed, and its
    exit status is the command's, as ``sys.exit`` gives it; an exception is not swallowed."""
    cases = {
        "print('said', end=''); import logging, sys; logging.getLogger().warning('logged');"
        " sys.exit(3)": (3, "said", "logged"),
        "import sys; sys.exit('refused')": (1, "", "refused"),
        "print('done')": (0, "done\n", ""),
        "raise KeyError('a bug')": (1, "", "KeyError: 'a bug'"),
    }
    for body, (status, out, err) in cases.items():
        code = ("from raybatch.cli.quick_exit import run_then_exit\n"
                f"run_then_exit(lambda: exec({body!r}))")  # fmt: skip
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
        assert proc.returncode == status, (body, proc.stderr)
        assert proc.stdout == out and err in proc.stderr, (body, proc.stdout, proc.stderr)
