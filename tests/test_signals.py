"""A driver stopped by a signal ends in one line and the resume command (raybatch/run/signals.py;
SIGTERM through a real search: tests/test_faults.py's copied run)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from raybatch.errors import SearchInterrupted
from raybatch.run.signals import interruptible, sigterm_as_interrupt


def test_ctrl_c_outside_tunes_loop_is_an_interruption_with_the_resume_command() -> None:
    before = signal.getsignal(signal.SIGTERM)
    resume_line = r"continue with `raybatch resume runs/x`"
    with pytest.raises(SearchInterrupted, match=resume_line), interruptible(Path("runs/x")):
        assert signal.getsignal(signal.SIGTERM) is not before  # taken as Ctrl-C inside
        raise KeyboardInterrupt  # the opening, or the write-up: no Tune loop to stop it
    assert signal.getsignal(signal.SIGTERM) == before  # the caller's handler back


def test_sigterm_is_taken_as_ctrl_c_only_inside_the_block() -> None:
    with sigterm_as_interrupt():
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler) and handler is not signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is not handler


def test_a_second_sigterm_during_the_graceful_stop_ends_the_driver_at_once(tmp_path: Path) -> None:
    """The first SIGTERM begins the graceful stop (Ctrl-C); a second, while that stop still
    runs, ends the process at once: one line with what was lost, exit 130."""
    script = tmp_path / "driver.py"
    script.write_text(
        "import sys, time\n"
        "from raybatch.run.signals import sigterm_as_interrupt\n"
        "with sigterm_as_interrupt('continue with `raybatch resume runs/x`'):\n"
        "    try:\n"
        "        print('ready', flush=True)\n"
        "        time.sleep(60)\n"
        "    except KeyboardInterrupt:\n"
        "        print('stopping', flush=True)\n"
        "        time.sleep(60)  # a graceful stop that takes its time\n"
        "sys.exit(3)\n"
    )
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert driver.stdout is not None
    assert driver.stdout.readline().strip() == "ready"
    driver.send_signal(signal.SIGTERM)
    assert driver.stdout.readline().strip() == "stopping"
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=30)
    assert driver.returncode == 130
    assert err.strip() == (
        "raybatch: stopped at once (a second SIGTERM): continue with `raybatch resume runs/x`"
    )
