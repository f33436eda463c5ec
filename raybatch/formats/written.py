"""The recipe written out in a snippet, so the snippet does not reload ``best_config.yaml``.

A retargeted recipe is not the file on disk: a snippet that reloaded it would train the old
accumulation and LR while its ``Trainer`` or ``ScalingConfig`` had the new world size. So the
Lightning and Ray Train snippets build their ``best`` from this line: the recipe itself, the
clipping and autocast it was measured under (which the loop must reproduce), and whether it is
the measured recipe.
"""

from __future__ import annotations

import pprint
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raybatch.space.config import TrialConfig


def best_line(c: TrialConfig, carried: dict[str, Any], source: str | None) -> str:
    """``best = raybatch.BestConfig(...)`` for ``c``, with ``carried`` (the provenance that
    changes training or says which recipe this is: :meth:`raybatch.BestConfig.carried`) and the
    file it came from."""
    recipe = pprint.pformat(c.to_dict(), indent=4, width=96, sort_dicts=False)
    head = "best = raybatch.BestConfig(raybatch.TrialConfig.from_dict("
    return f"{head}\n{recipe}\n), {carried!r}, {source!r})\n"


def origin_comment(origin: dict[str, Any]) -> str:
    """A recipe's origin (:meth:`raybatch.BestConfig.origin`) as comment lines (``#``) for the
    text formats: where it came from, and whether it is the measured recipe."""
    trial = f", trial {origin['trial_id']}" if origin["trial_id"] else ""
    head = f"# raybatch recipe from {origin['from']}{trial}:"
    if origin["measured"]:
        lines = [f"{head} the measured recipe"]
    else:
        lines = [f"{head} NOT MEASURED", f"# {origin.get('retargeted', 'NOT MEASURED')}"]
    return "\n".join(lines) + "\n"


__all__ = ["best_line", "origin_comment"]
