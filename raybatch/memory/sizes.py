"""Sizes in bytes, as people write them (``2GiB``, ``1500MB``) and as raybatch says them.

Read by ``pydantic.ByteSize`` (binary units KiB..TiB are powers of 1024, decimal ones KB..TB
powers of 1000, as in the IEC/SI standards and as ``nvidia-smi`` reports MiB); a bare number,
scientific notation included, is bytes.
"""

from __future__ import annotations

import math

from raybatch.errors import Issue, OptionError

_UNITS_TEXT = "units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"


def parse_size(
    value: str | int | float, field: str = "memory_budget", source: str = "<python>"
) -> int:
    """Bytes from ``"2GiB"``, ``"1500MB"``, ``"512 MiB"``, ``"1e9"`` or a number of bytes.

    Sizes with a unit are read by ``pydantic.ByteSize`` (binary units KiB..TiB are powers of
    1024, decimal ones KB..TB powers of 1000, as in the IEC/SI standards and as
    ``nvidia-smi`` reports MiB); a bare number, scientific notation included, is bytes.

    Raises:
        OptionError: Not a size, an unknown unit, zero or negative.
    """
    from pydantic import ByteSize, TypeAdapter, ValidationError

    allowed = f"a positive size such as 2GiB, 1500MB or 1073741824 ({_UNITS_TEXT})"

    def refuse(message: str) -> OptionError:
        return OptionError([Issue(field, message)], source)

    if isinstance(value, bool):
        raise refuse(f"must be {allowed}, got {value!r}")
    number: float | int | None = value if isinstance(value, int | float) else _number(value)
    if number is not None:
        if not math.isfinite(number):
            raise refuse(f"must be {allowed}, got {value!r}")
        size = int(number)
    else:
        try:
            size = int(TypeAdapter(ByteSize).validate_python(str(value).strip()))
        except ValidationError as exc:
            if exc.errors()[0]["type"] == "byte_size_unit":
                unit = str(value).strip().lstrip("0123456789. ")
                raise refuse(f"unknown unit {unit!r} in {value!r}; must be {allowed}") from None
            raise refuse(f"must be {allowed}, got {value!r}") from None
    if size <= 0:
        raise refuse(f"must be {allowed}, got {value!r}")
    return size


def _number(text: str) -> float | None:
    """A bare number of bytes written as text (``"1073741824"``, ``"1e9"``), else None."""
    try:
        return float(text)
    except ValueError:
        return None


def format_bytes(n: int | float) -> str:
    """Binary human units: ``1.50 GiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{size:.2f} TiB"


__all__ = ["format_bytes", "parse_size"]
