"""The package's public face: every exported name resolves, and importing it stays cheap."""

from __future__ import annotations

import subprocess
import sys

import raybatch


def test_every_public_name_resolves_to_its_object() -> None:
    for name in raybatch.__all__:
        assert getattr(raybatch, name) is not None, name
    assert sorted(raybatch.__all__) == dir(raybatch)


def test_all_lists_exactly_the_names_of_the_lazy_export_table() -> None:
    from raybatch import _MODULE_OF

    assert set(raybatch.__all__) == {*_MODULE_OF, "__version__"}
    assert {"RaybatchSearcher", "CappingScheduler", "FailFast", "Metric"} <= set(_MODULE_OF)


def test_import_and_the_trial_reporter_load_no_heavy_dependency() -> None:
    """Each trial is a fresh Ray worker: what it imports is paid once per trial."""
    code = (
        "import sys, raybatch; raybatch.TrialReporter;"
        "print(sorted(m for m in ('torch', 'ray', 'optuna', 'pydantic', 'yaml', 'raybatch.space')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        raybatch.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
