"""The watch that ends a local Ray's processes once its driver has ended, however it ended."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from raybatch.run.orphans import ray_processes_of_group


def _sleeper(folder: Path) -> subprocess.Popen[bytes]:
    """A process run from ``folder`` (as Ray's run from its package folder), in a process group
    of its own, that ignores SIGTERM (as Ray's two agents do)."""
    script = folder / "agent.py"
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "time.sleep(120)\n")  # fmt: skip
    return subprocess.Popen([sys.executable, str(script)], start_new_session=True)


def test_the_watch_kills_its_groups_ray_processes_once_the_driver_pipe_closes(
    tmp_path: Path,
) -> None:
    ray_dir = tmp_path / "site-packages" / "ray"
    ray_dir.mkdir(parents=True)
    other = tmp_path / "mine"
    other.mkdir()
    agent, bystander = _sleeper(ray_dir), _sleeper(other)
    try:
        time.sleep(0.5)  # both have exec'd their command lines
        group = agent.pid  # a new session leads its own group
        assert ray_processes_of_group(group, -1, str(ray_dir)) == [agent.pid]
        assert ray_processes_of_group(group, agent.pid, str(ray_dir)) == []  # spared
        assert ray_processes_of_group(bystander.pid, -1, str(ray_dir)) == []  # not Ray's
        watch = subprocess.Popen(
            [sys.executable, "-m", "raybatch.run.orphans", str(group), "-1", str(ray_dir)],
            stdin=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        assert watch.stdin is not None
        time.sleep(0.5)
        assert agent.poll() is None  # the driver's pipe is open: nothing is touched
        watch.stdin.close()  # the driver ended
        assert watch.wait(timeout=60) == 0
        assert agent.wait(timeout=60) == -9
        assert bystander.poll() is None  # only Ray's processes of that group
    finally:
        for proc in (agent, bystander):
            proc.kill()
            proc.wait()
