"""Finding the bundled search-space presets (``search_spaces/*.yaml``).

A preset is addressed by its file stem (``resnet50_imagenet_sgd``); anything that looks
like a path is read as a file instead, so the CLI and :func:`load_space` take either.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from raybatch.errors import PresetNotFoundError
from raybatch.space.search_space import SearchSpace

_PACKAGE = Path(__file__).resolve().parent.parent


def preset_dir() -> Path:
    """The folder holding the presets.

    In a wheel they are packaged as ``raybatch/_search_spaces``; in a source checkout
    (editable install, tests) they are the repository's ``search_spaces/``.
    """
    for candidate in (_PACKAGE / "_search_spaces", _PACKAGE.parent / "search_spaces"):
        if candidate.is_dir():
            return candidate
    raise PresetNotFoundError(f"no search_spaces folder beside {_PACKAGE}")


@dataclass(frozen=True)
class PresetInfo:
    """A bundled preset: its name, file and one-line description."""

    name: str
    path: Path
    description: str


def list_presets() -> list[PresetInfo]:
    """Every bundled preset, sorted by name (each file is loaded, so each is validated)."""
    out = []
    for path in sorted(preset_dir().glob("*.yaml")):
        space = SearchSpace.from_yaml(path)
        out.append(PresetInfo(path.stem, path, space.description))
    return out


def resolve_space_path(name_or_path: str | Path) -> Path:
    """The file a preset name or path refers to.

    Raises:
        PresetNotFoundError: Neither a preset of that name nor a file at that path exists;
            the message lists the presets.
    """
    text = str(name_or_path)
    as_path = Path(text)
    looks_like_path = as_path.suffix in (".yaml", ".yml") or "/" in text or "\\" in text
    if looks_like_path:
        if as_path.is_file():
            return as_path
        raise PresetNotFoundError(f"{text}: no such space file")
    preset = preset_dir() / f"{text}.yaml"
    if preset.is_file():
        return preset
    names = ", ".join(p.stem for p in sorted(preset_dir().glob("*.yaml")))
    raise PresetNotFoundError(f"{text}: no preset of that name (presets: {names})")


def load_space(name_or_path: str | Path) -> SearchSpace:
    """Load a search space by preset name (``resnet50_imagenet_sgd``) or file path.

    Example:
        >>> import raybatch
        >>> space = raybatch.load_space("resnet50_imagenet_sgd")
        >>> space.derive(micro_batch_size=256, accumulation_steps=2).lr
        0.2
    """
    return SearchSpace.from_yaml(resolve_space_path(name_or_path))
