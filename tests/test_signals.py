"""A driver stopped by a signal ends in one line and the resume command (raybatch/run/signals.py;
SIGTERM through a real search: tests/test_faults.py's copied run)."""

from __future__ import annotations

import signal
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
