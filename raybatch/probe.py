"""Old home of the real probe, kept because the README has documented ``raybatch.probe.probe``.

The probe lives in :mod:`raybatch.memory.probe`, beside the rest of the memory pre-screen.
"""

from raybatch.memory.probe import ProbeResult, is_out_of_memory, move_to, probe, release_memory

__all__ = ["ProbeResult", "is_out_of_memory", "move_to", "probe", "release_memory"]
