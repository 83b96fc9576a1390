"""The model registry without a server: which export is registered, that it is finished, that a
version's files never change, which evaluation it is tagged with, and reading a model back."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hpcpipe.checkpoint import export_record
from hpcpipe.errors import UserError
from hpcpipe.evaluate.calibrate import adapter_sha256
from hpcpipe.track.mlflow_client import record_run
from hpcpipe.track.registry import register_run, show_model


class FakeClient:
    """What register and show ask of MLflow; artifacts kept as {artifact path: bytes}."""

    def __init__(self) -> None:
        self.artifacts: dict[str, bytes] = {}
        self.versions: list[SimpleNamespace] = []

    def get_run(self, run_id: str) -> None:
        pass

    def log_artifact(self, run_id: str, local: str, artifact_path: str) -> None:
        self.artifacts[f"{artifact_path}/{Path(local).name}"] = Path(local).read_bytes()

    def log_artifacts(self, run_id: str, local: str, artifact_path: str) -> None:
        for path in Path(local).rglob("*"):
            if path.is_file():
                self.artifacts[f"{artifact_path}/{path.relative_to(local)}"] = path.read_bytes()

    def create_registered_model(self, name: str, description: str) -> None:
        pass

    def create_model_version(self, name: str, source: str, run_id: str, **kw: Any) -> SimpleNamespace:
        made = SimpleNamespace(name=name, version=len(self.versions) + 1, source=source, run_id=run_id, **kw)
        self.versions.append(made)
        return made

    def set_registered_model_alias(self, name: str, alias: str, version: str) -> None:
        pass

    def get_registered_model(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(name=name, aliases={})

    def search_model_versions(self, filter_string: str, page_token: str | None = None) -> list[Any]:
        """Parsed as MLflow parses it: a filter it reads otherwise finds nothing."""
        from mlflow.utils.search_utils import SearchModelVersionUtils

        [clause] = SearchModelVersionUtils.parse_search_filter(filter_string)
        return [v for v in self.versions if v.name == clause["value"]]

    def files(self, source: str) -> dict[str, bytes]:
        prefix = source.split("/", 2)[2] + "/"  # runs:/<id>/<artifact path>
        return {k.removeprefix(prefix): v for k, v in self.artifacts.items() if k.startswith(prefix)}


def _run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "export").mkdir(parents=True)
    record_run(run_dir, "http://first:5000", "r1", "exp")
    return run_dir


def _export(run_dir: Path, step: int, content: bytes = b"weights", fmt: str = "safetensors") -> Path:
    """An export as ``hpcpipe ckpt export`` leaves it: its files and the record listing them."""
    folder = run_dir / "export" / f"step-{step:08d}-{fmt}"
    folder.mkdir(exist_ok=True)
    (folder / "model.safetensors").write_bytes(content)
    record = {"checkpoint": str(run_dir / f"checkpoints/step-{step:08d}"), "format": fmt}
    (folder / ".hpcpipe-export").write_text(json.dumps({**record, "files": ["model.safetensors"]}))
    return folder


def test_a_folder_exported_again_never_changes_the_files_of_an_earlier_version(tmp_path: Path) -> None:
    """Both went to model/<export name>: the bf16 export replaced the fp32 version's file."""
    run_dir, client = _run(tmp_path), FakeClient()
    folder = _export(run_dir, 30, b"fp32")
    fp32 = register_run(client, run_dir, "fp32model", [], folder)
    _export(run_dir, 30, b"bf16")
    bf16 = register_run(client, run_dir, "bf16model", [], folder)
    assert fp32.source != bf16.source
    assert client.files(fp32.source) == {"model.safetensors": b"fp32"}
    assert client.files(bf16.source) == {"model.safetensors": b"bf16"}
    assert register_run(client, run_dir, "again", [], folder).source == bf16.source  # same files


def test_the_newest_checkpoint_s_export_is_chosen_and_tagged_with_its_own_evaluation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The newest by modification time was chosen (an old checkpoint exported again), and tagged
    with eval.json's metrics whichever checkpoint they were of."""
    run_dir, client = _run(tmp_path), FakeClient()
    newest = _export(run_dir, 30)
    older = _export(run_dir, 10)  # written last
    evaluated = {"metrics": {"val_loss": 4.2}, "checkpoint": "step-00000030"}
    (run_dir / "eval.json").write_text(json.dumps(evaluated))
    register_run(client, run_dir, "m", [])
    assert client.versions[-1].tags["hpcpipe.export"] == newest.name
    assert client.versions[-1].tags["eval.val_loss"] == "4.2"
    with caplog.at_level(logging.WARNING, logger="hpcpipe.track"):
        register_run(client, run_dir, "m", [], older)
    assert not any(k.startswith("eval.") for k in client.versions[-1].tags)
    assert "eval.json evaluated checkpoint step-00000030, the export is of step-00000010" in caplog.text


def test_an_unfinished_export_is_refused_naming_it(tmp_path: Path) -> None:
    """A killed export's staging folder (and a folder no export finished) was uploaded."""
    run_dir, client = _run(tmp_path), FakeClient()
    folder = _export(run_dir, 30)
    staging = folder / ".partial-123"
    staging.mkdir()
    (staging / "model.safetensors").write_bytes(b"half")
    with pytest.raises(UserError, match=rf"{folder}: its export did not finish \(\.partial-123 was never"):
        register_run(client, run_dir, "m", [])
    (staging / "model.safetensors").unlink()  # killed after its files were moved in
    made = register_run(client, run_dir, "m", [])
    assert client.files(made.source) == {"model.safetensors": b"weights"}
    (folder / "model.safetensors").unlink()
    with pytest.raises(UserError, match=r"did not finish \(model\.safetensors is missing\)"):
        register_run(client, run_dir, "m", [], folder)
    by_hand = run_dir / "export" / "mine"  # not a folder of the run's own: no record, no export
    by_hand.mkdir()
    (by_hand / "model.safetensors").write_bytes(b"by hand")
    with pytest.raises(UserError, match=rf"{by_hand}: not an hpcpipe export \(no \.hpcpipe-export\)"):
        register_run(client, run_dir, "m", [], by_hand)
    fd = os.open(_export(run_dir, 40) / ".hpcpipe-export.lock", os.O_RDWR | os.O_CREAT)  # an export writing
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(UserError, match="an export is writing there now"):
            register_run(client, run_dir, "m", [])
    finally:
        os.close(fd)


def _adapter(run_dir: Path, step: int | None) -> Path:
    """The adapter the training wrote at its end: with its record (``step``), or as written before
    adapters had one (``None``); the call threshold chosen later beside it (set on these weights;
    before records, before hashes too)."""
    adapter = run_dir / "export" / "adapter"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"lora")
    if step is not None:
        record = {"format": "adapter", "step": step, "files": ["adapter_model.safetensors"]}
        (adapter / ".hpcpipe-export").write_text(json.dumps(record))
    threshold = {"adapter_sha256": adapter_sha256(adapter)} if step is not None else {}
    (adapter / "call_threshold.json").write_text(json.dumps(threshold))
    return adapter


def test_the_training_s_adapter_counts_by_its_step_and_carries_its_evaluation(tmp_path: Path) -> None:
    """Any checkpoint's export beat the adapter written at the end (an export of step 100 made
    mid-run, the run trained on to 500), and the adapter, without a record, never got eval.*."""
    run_dir, client = _run(tmp_path), FakeClient()
    adapter = _adapter(run_dir, 500)
    _export(run_dir, 100)  # written last
    (run_dir / "eval.json").write_text(
        json.dumps({"metrics": {"val_loss": 1.5}, "checkpoint": "step-00000500"})
    )
    made = register_run(client, run_dir, "m", [])
    assert client.versions[-1].tags["hpcpipe.export"] == "adapter"
    assert client.versions[-1].tags["eval.val_loss"] == "1.5"
    threshold = (adapter / "call_threshold.json").read_bytes()
    assert client.files(made.source) == {
        "adapter_model.safetensors": b"lora",
        "call_threshold.json": threshold,
    }
    _export(run_dir, 600)  # exported from a later checkpoint: the newest
    assert register_run(client, run_dir, "m", []).source.split("/")[-1].startswith("step-00000600-")
    (adapter / ".partial-7").mkdir()  # killed while writing a new one: never registered
    (adapter / ".partial-7" / "adapter_model.safetensors").write_bytes(b"half")
    with pytest.raises(UserError, match=r"adapter: its export did not finish \(\.partial-7 was never"):
        register_run(client, run_dir, "m", [], adapter)


def test_an_adapter_written_before_records_is_taken_alone_or_asked_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its step is unknown: taken when it is the run's only export, else left out with a line."""
    run_dir, client = _run(tmp_path), FakeClient()
    adapter = _adapter(run_dir, None)
    with caplog.at_level(logging.WARNING, logger="hpcpipe.track"):
        made = register_run(client, run_dir, "m", [])
    assert client.files(made.source) == {"adapter_model.safetensors": b"lora", "call_threshold.json": b"{}"}
    assert "registering it, the only export (its step is unrecorded)" in caplog.text
    _export(run_dir, 10)
    with caplog.at_level(logging.WARNING, logger="hpcpipe.track"):
        assert client.files(register_run(client, run_dir, "m", []).source) == {
            "model.safetensors": b"weights"
        }
    assert f"{adapter}: left out, written before adapters recorded their step" in caplog.text
    assert client.files(register_run(client, run_dir, "m", [], adapter).source)["adapter_model.safetensors"]


def test_an_export_written_before_records_is_registered_only_when_asked_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A default folder of the run's own from before `.hpcpipe-export` was written in place: one
    a kill cut short was registered as finished, chosen by its step over recorded exports."""
    run_dir, client = _run(tmp_path), FakeClient()
    old = run_dir / "export" / "step-00000020-hf"
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"w")
    with pytest.raises(UserError, match=rf"^{old}: written before export records, .* pass --export"):
        register_run(client, run_dir, "m", [])
    (run_dir / "eval.json").write_text(
        json.dumps({"metrics": {"val_loss": 2.0}, "checkpoint": "step-00000020"})
    )
    with caplog.at_level(logging.WARNING, logger="hpcpipe.track"):
        assert client.files(register_run(client, run_dir, "m", [], old).source) == {"model.safetensors": b"w"}
    assert (
        f"{old}: written before export records, so whether a kill cut it short cannot be checked"
        in caplog.text
    )
    assert client.versions[-1].tags["eval.val_loss"] == "2.0"  # its step is its name's
    _export(run_dir, 10)
    with caplog.at_level(logging.WARNING, logger="hpcpipe.track"):
        assert register_run(client, run_dir, "m", []).source.split("/")[-1].startswith("step-00000010-")
    assert f"{old}: left out, written before export records" in caplog.text
    (old / ".partial-9").mkdir()
    (old / ".partial-9" / "model.safetensors").write_bytes(b"half")
    with pytest.raises(UserError, match=r"did not finish \(\.partial-9 was never moved in\)"):
        register_run(client, run_dir, "m", [], old)


def test_an_export_being_written_is_not_taken_for_one_from_before_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A folder holding only an export's staging folder and its lock (still being written, or
    killed) was "written before export records", and the advice, --export, then failed."""
    from hpcpipe.track.registry import newest_export

    run_dir = _run(tmp_path)
    staged = run_dir / "export" / "step-4-hf"
    (staged / ".partial-99").mkdir(parents=True)
    (staged / ".partial-99" / "model.safetensors").write_bytes(b"half")
    (staged / ".hpcpipe-export.lock").touch()
    with pytest.raises(UserError, match=rf"^{staged}: an export still being written, or one killed") as got:
        newest_export(run_dir)
    assert "--export" not in str(got.value) and "before export records" not in str(got.value)
    done = _export(run_dir, 2)
    with caplog.at_level(logging.WARNING, logger="hpcpipe.track"):
        assert newest_export(run_dir) == done
    assert f"{staged}: left out, an export still being written" in caplog.text


def test_an_empty_export_folder_is_no_export(tmp_path: Path) -> None:
    """It read as "only its staging folder is there" (all() of nothing is true)."""
    from hpcpipe.track.registry import newest_export

    run_dir = _run(tmp_path)
    (run_dir / "export" / "step-2-hf").mkdir()
    with pytest.raises(UserError, match=r": no export \(export/<step>-<format>\)"):
        newest_export(run_dir)


def test_a_threshold_or_rule_set_on_earlier_weights_is_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Trained again without lora.calibration_cases, the adapter kept the earlier weights' call
    threshold and decline rule beside it, and register uploaded them with the new weights."""
    run_dir, client = _run(tmp_path), FakeClient()
    adapter = _adapter(run_dir, 100)
    (adapter / "decline.json").write_text("{}")  # no hash beside a recorded adapter: stale
    (adapter / "adapter_model.safetensors").write_bytes(b"trained again")
    (adapter / ".hpcpipe-export").write_text(
        json.dumps({"format": "adapter", "step": 200, "files": ["adapter_model.safetensors"]})
    )
    with caplog.at_level(logging.WARNING, logger="hpcpipe.track"):
        made = register_run(client, run_dir, "m", [])
    assert client.files(made.source) == {"adapter_model.safetensors": b"trained again"}
    for name in ("call_threshold.json", "decline.json"):
        assert f"{adapter / name}: left out, set on an earlier adapter" in caplog.text
    (adapter / "call_threshold.json").write_text(json.dumps({"adapter_sha256": adapter_sha256(adapter)}))
    assert "call_threshold.json" in client.files(register_run(client, run_dir, "m", []).source)


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.ENOLCK, errno.EBADF, errno.EOPNOTSUPP])
def test_a_file_system_without_locks_registers_unlocked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    """Lustre without flock (ENOSYS), NFS without lockd (ENOLCK, EBADF): a traceback."""
    run_dir, client = _run(tmp_path), FakeClient()

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(export_record.fcntl, "flock", no_locks)
    with caplog.at_level(logging.WARNING, logger="hpcpipe.checkpoint"):
        made = register_run(client, run_dir, "m", [], _export(run_dir, 30))
    assert client.files(made.source) == {"model.safetensors": b"weights"}
    assert f"no file locks here ({os.strerror(code)}); going on unlocked" in caplog.text


def test_a_name_holding_a_quote_shows_its_versions(tmp_path: Path) -> None:
    """The name was quoted with a backslash, which MLflow's filter reads as part of the name."""
    run_dir, client = _run(tmp_path), FakeClient()
    register_run(client, run_dir, "it's", [], _export(run_dir, 30))
    assert [v["version"] for v in show_model(client, "it's")["versions"]] == ["1"]
    with pytest.raises(UserError, match="""--name a'b"c: holds both ' and \""""):
        register_run(client, run_dir, """a'b"c""", [], _export(run_dir, 30))


def test_the_run_registered_is_the_one_on_the_server_registered_to(tmp_path: Path) -> None:
    """The record keeps a run id per server; register took the first server's on any server,
    where MLflow does not know it."""
    run_dir, client = _run(tmp_path), FakeClient()
    record_run(run_dir, "http://second:5000", "r2", "exp")
    folder = _export(run_dir, 30)
    assert register_run(client, run_dir, "m", [], folder, "http://second:5000").source.startswith("runs:/r2/")
    assert register_run(client, run_dir, "m", [], folder).source.startswith("runs:/r1/")

    class Second(FakeClient):  # the second server, reached by another URI: it has r2 only
        def get_run(self, run_id: str) -> Any:
            if run_id != "r2":
                raise RuntimeError(f"RESOURCE_DOES_NOT_EXIST: Run '{run_id}' not found")
            return SimpleNamespace(info=SimpleNamespace(lifecycle_stage="active"))

    made = register_run(Second(), run_dir, "m", [], folder, "http://localhost:5000")
    assert made.source.startswith("runs:/r2/")
