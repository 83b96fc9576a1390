"""Every property hpcpipe asks of a recipe (`hpcpipe recipes check`), as a test of this package."""

from pathlib import Path

from hpcpipe.testing import assert_recipe_passes


def test_the_recipe_has_every_property(tmp_path: Path) -> None:
    assert_recipe_passes("stdlib-classifier", work=tmp_path)
