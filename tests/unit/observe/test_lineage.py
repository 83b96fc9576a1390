"""lineage.json across resumes: a run resumed on another dataset keeps the one it trained on before."""

from __future__ import annotations

from pathlib import Path

from hpcpipe.observe.lineage import read_lineage, with_earlier_dataset, write_lineage

A, B, C = "a" * 64, "b" * 64, "c" * 64


def test_a_resume_on_another_dataset_keeps_the_earlier_one(tmp_path: Path) -> None:
    """It was overwritten: lineage.json named only the dataset of the last start."""
    write_lineage(tmp_path, {"dataset_manifest_sha256": A, "steps": {"train": {"status": "done"}}})
    lineage, earlier = with_earlier_dataset(tmp_path, {"dataset_manifest_sha256": B}, resumed_at=40)
    assert earlier == A
    write_lineage(tmp_path, lineage)
    lineage, earlier = with_earlier_dataset(tmp_path, {"dataset_manifest_sha256": C}, resumed_at=90)
    write_lineage(tmp_path, lineage)
    written = read_lineage(tmp_path)
    assert written["dataset_manifest_sha256"] == C and "train" in written["steps"]
    assert written["earlier_datasets"] == [
        {"dataset_manifest_sha256": A, "until_step": 40},
        {"dataset_manifest_sha256": B, "until_step": 90},
    ]
    write_lineage(tmp_path, {"dataset_manifest_sha256": C})  # a restart on the same data keeps them
    assert len(read_lineage(tmp_path)["earlier_datasets"]) == 2


def test_a_resume_that_fell_back_past_a_switch_drops_the_later_entries(tmp_path: Path) -> None:
    """Trained on A to step 40, B to 90, then C; the newest checkpoints failed verification and
    the run resumed at step 50 (trained on A, then B) on D: the model's data were A and B."""
    write_lineage(
        tmp_path,
        {
            "dataset_manifest_sha256": C,
            "earlier_datasets": [
                {"dataset_manifest_sha256": A, "until_step": 40},
                {"dataset_manifest_sha256": B, "until_step": 90},
            ],
        },
    )
    lineage, earlier = with_earlier_dataset(tmp_path, {"dataset_manifest_sha256": "d" * 64}, resumed_at=50)
    assert earlier == B
    assert lineage["earlier_datasets"] == [
        {"dataset_manifest_sha256": A, "until_step": 40},
        {"dataset_manifest_sha256": B, "until_step": 50},
    ]
    lineage, earlier = with_earlier_dataset(tmp_path, {"dataset_manifest_sha256": A}, resumed_at=30)
    assert earlier is None and lineage["earlier_datasets"] == []  # back in A's stretch, on A again


def test_a_fresh_start_or_the_same_dataset_is_no_change(tmp_path: Path) -> None:
    write_lineage(tmp_path, {"dataset_manifest_sha256": A})
    assert with_earlier_dataset(tmp_path, {"dataset_manifest_sha256": A}, resumed_at=40)[1] is None
    assert with_earlier_dataset(tmp_path, {"dataset_manifest_sha256": B}, resumed_at=0)[1] is None
    assert with_earlier_dataset(tmp_path, {"dataset_manifest_sha256": None}, resumed_at=40)[1] is None
    lineage, _ = with_earlier_dataset(tmp_path, {"dataset_manifest_sha256": B}, resumed_at=40)
    write_lineage(tmp_path, lineage)
    lineage, _ = with_earlier_dataset(tmp_path, {"dataset_manifest_sha256": C}, resumed_at=0)
    write_lineage(tmp_path, lineage)  # a new run in the directory: the old run's history is not its own
    assert not read_lineage(tmp_path).get("earlier_datasets")


def test_the_dataset_change_is_a_listed_event(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The suite checks every events.jsonl line against observe/event_kinds.py (CHECK_EVENTS_VAR)."""
    import json

    from hpcpipe.launch.worker import _note_dataset_change

    _note_dataset_change(tmp_path, 40, A, B)
    (line,) = (tmp_path / "events.jsonl").read_text().splitlines()
    assert json.loads(line) | {"time": 0} == {
        "time": 0,
        "event": "dataset_changed",
        "step": 40,
        "earlier": A,
        "now": B,
    }
    assert (
        "note: resumed at step 40 on another dataset (aaaaaaaaaaaa -> bbbbbbbbbbbb)"
        in capsys.readouterr().err
    )


def test_a_resume_with_another_config_keeps_the_earlier_ones() -> None:
    """A resume rewrote config_hash and git_sha: a model trained at lr 0.003 named lr 0.0003's."""
    import tempfile
    from pathlib import Path

    from hpcpipe.observe.lineage import with_earlier_starts

    run = Path(tempfile.mkdtemp())
    write_lineage(run, {"config_hash": "a", "git_sha": "s1"})
    same = with_earlier_starts(run, {"config_hash": "a", "git_sha": "s1"}, resumed_at=20)
    assert "earlier_starts" not in same  # resumed as it was
    lineage = with_earlier_starts(run, {"config_hash": "b", "git_sha": "s1"}, resumed_at=20)
    assert lineage["earlier_starts"] == [{"config_hash": "a", "git_sha": "s1", "until_step": 20}]
    write_lineage(run, lineage)
    later = with_earlier_starts(run, {"config_hash": "c", "git_sha": "s2"}, resumed_at=40)
    assert [e["until_step"] for e in later["earlier_starts"]] == [20, 40]
    fell_back = with_earlier_starts(run, {"config_hash": "c", "git_sha": "s2"}, resumed_at=10)
    assert fell_back["earlier_starts"] == [
        {"config_hash": "a", "git_sha": "s1", "until_step": 10}
    ]  # a made it
    assert with_earlier_starts(run, {"config_hash": "d"}, resumed_at=0)["earlier_starts"] == []
