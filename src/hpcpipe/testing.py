"""pytest helpers for recipe authors: the properties of ``hpcpipe recipes check``, as assertions.

A recipe package's test (``hpcpipe new recipe`` writes one)::

    from hpcpipe.testing import assert_recipe_passes

    def test_the_recipe_has_every_property(tmp_path):
        assert_recipe_passes("my-recipe", work=tmp_path)

    def test_it_resumes_bit_for_bit(tmp_path):
        assert_recipe_passes("my-recipe", work=tmp_path, only=("resume-after-kill",))

Each property runs as ``hpcpipe recipes check`` runs it: at test size on the CPU, with real
``hpcpipe train`` runs on 1 and 2 gloo ranks (``PROPERTIES`` lists them in order).
"""

from __future__ import annotations

from pathlib import Path

from hpcpipe.recipecheck.runner import PROPERTIES, RTOL, CheckReport, PropertyResult, check_recipe

__all__ = ["PROPERTIES", "RTOL", "CheckReport", "PropertyResult", "assert_recipe_passes", "check_recipe"]


def assert_recipe_passes(
    recipe: str,
    config: str | None = None,
    sets: list[str] | tuple[str, ...] = (),
    work: str | Path | None = None,
    only: tuple[str, ...] = (),
    rtol: float = RTOL,
) -> CheckReport:
    """Check ``recipe`` (a name or ``module:Class``); AssertionError listing every property that
    failed, with the traceback where the recipe's code raised. Skipped properties pass."""
    report = check_recipe(recipe, config, sets, work, only, rtol=rtol)
    failed = [r for r in report.results if not (r.passed or r.skipped)]
    if failed:
        lines = [f"recipe {recipe}: {len(failed)} of {len(report.results)} properties failed"]
        for result in failed:
            lines.append(f"- {result.name}: {result.detail}")
            if result.traceback:
                lines.append(result.traceback)
        if report.kept:
            lines.append(f"the runs and their logs are kept in {report.kept}")
        raise AssertionError("\n".join(lines))
    return report
