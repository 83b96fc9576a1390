"""The pinned public API of hpcpipe.data: every name in __all__ resolves; loaders load lazily."""

from __future__ import annotations

from hpcpipe import data


def test_every_public_name_resolves() -> None:
    assert sorted(data.__all__) == sorted(set(data.__all__))
    for name in data.__all__:
        assert getattr(data, name) is not None, name


def test_loaders_are_the_loader_module_classes() -> None:
    from hpcpipe.data.tokens import loader

    assert data.TokenWindowLoader is loader.TokenWindowLoader
    assert data.EvalWindows is loader.EvalWindows
