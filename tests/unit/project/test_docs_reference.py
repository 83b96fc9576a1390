"""docs/reference/ is generated from the code (scripts/build_reference.py): the committed pages must
be what the script writes now, a config field without a description stops it (naming the field),
and the events table matches the kinds the code writes."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import Field

from hpcpipe.config.section import Section
from hpcpipe.observe.event_kinds import EVENT_KINDS, check_event

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = ROOT / "scripts"
SRC = ROOT / "src" / "hpcpipe"


def test_the_reference_pages_are_current() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "build_reference.py"), "--check"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr + "(run: make docs)"


def test_a_field_without_a_description_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import build_reference
    import reference_config

    class Inner(Section):
        """A section."""

        documented: int = Field(1, description="Has one.")
        bare: int = 2

    class Job(Section):
        """The job."""

        inner: Inner = Field(default_factory=Inner)

    monkeypatch.setattr(reference_config, "JobConfig", Job)
    monkeypatch.setattr(sys, "argv", ["build_reference.py", "--check"])
    assert build_reference.main() == 2
    err = capsys.readouterr().err
    assert "config field inner.bare (Inner.bare in " in err and err.count("\n") == 1


def _emitted_kinds() -> set[str]:
    """Kinds passed as a string literal to the event writers: ``append_event(dir, "kind", ...)``,
    ``events.emit("kind", ...)``, ``_event("kind", ...)``, ``report("kind", ...)``."""
    kinds: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            position = {"append_event": 1, "emit": 0, "_event": 0, "event": 0, "report": 0}.get(name)
            if position is None or len(node.args) <= position:
                continue
            arg = node.args[position]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.isidentifier():
                kinds.add(arg.value)
    return kinds


def test_every_event_kind_written_is_in_the_table() -> None:
    assert _emitted_kinds() - set(EVENT_KINDS) == set()


def test_every_event_kind_in_the_table_is_written_somewhere() -> None:
    text = "\n".join(p.read_text() for p in SRC.rglob("*.py") if p.name != "event_kinds.py")
    assert [kind for kind in EVENT_KINDS if f'"{kind}"' not in text] == []


def test_the_suite_checks_each_line_against_the_table() -> None:
    check_event("restart", {"restart_count": 1})
    check_event("pruned", {"step": 3, "why": "median", "val_loss": 2.5})  # its metric, named at run time
    with pytest.raises(ValueError, match="kind 'restarted' is not in"):
        check_event("restarted", {})
    with pytest.raises(ValueError, match=r"restart has fields \['count'\]"):
        check_event("restart", {"count": 1})


def _config_keys() -> set[str]:
    """Every dotted key and section of a job's config (``fault.hang_timeout_s``, ``observe.otel``)."""
    import typing

    from pydantic import BaseModel

    from hpcpipe.config import JobConfig

    keys: set[str] = set()

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            key = prefix + (info.alias or name)
            keys.add(key)
            for arg in (info.annotation, *typing.get_args(info.annotation)):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    walk(arg, key + ".")

    walk(JobConfig, "")
    return keys


def test_the_config_keys_the_events_table_names_exist() -> None:
    import re

    sections = "|".join(sorted({key.split(".")[0] for key in _config_keys()}))
    named = re.compile(rf"\b(?:{sections})\.[a-z_]+(?:\.[a-z_]+)*")
    texts = [spec.meaning for spec in EVENT_KINDS.values()]
    texts += [text for spec in EVENT_KINDS.values() for text in spec.fields.values()]
    texts += [spec.named_at_run_time or "" for spec in EVENT_KINDS.values()]
    unknown = {key for text in texts for key in named.findall(text)} - _config_keys()
    assert unknown == set(), f"observe/event_kinds.py names config keys that do not exist: {unknown}"
