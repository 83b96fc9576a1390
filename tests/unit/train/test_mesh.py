"""Which per-rank states a resumed run may restore: only where every rank keeps its place."""

from __future__ import annotations

from hpcpipe.train.mesh import Layout, same_rank_places

DDP_2 = Layout(dp=2, tp=1, dp_rank=0)
PP_2 = Layout(dp=1, tp=1, dp_rank=0, pp=2)
TP_2_DP_2 = Layout(dp=2, tp=2, dp_rank=0)
PP_2_TP_2 = Layout(dp=1, tp=2, dp_rank=0, pp=2)


def _saved(world: int, layout: Layout) -> dict[str, object]:
    return {"world_size": world, "tp": layout.tp, "layout": layout.shape()}


def test_the_same_layout_keeps_every_rank_in_its_place() -> None:
    for world, layout in ((2, DDP_2), (2, PP_2), (4, TP_2_DP_2), (4, PP_2_TP_2)):
        assert same_rank_places(_saved(world, layout), world, layout)


def test_another_split_of_the_same_world_is_another_layout() -> None:
    """pp 2 and DDP dp 2 on the same two ranks (the old check compared world and tp only)."""
    assert not same_rank_places(_saved(2, PP_2), 2, DDP_2)
    assert not same_rank_places(_saved(2, DDP_2), 2, PP_2)
    assert not same_rank_places(_saved(4, PP_2_TP_2), 4, TP_2_DP_2)
    assert not same_rank_places(_saved(2, DDP_2), 1, Layout(dp=1, tp=1, dp_rank=0))


def test_a_state_saved_before_the_layout_was_recorded_reads_as_pp_1() -> None:
    old_tp = {"world_size": 4, "tp": 2}
    assert same_rank_places(old_tp, 4, TP_2_DP_2)
    assert not same_rank_places(old_tp, 4, PP_2_TP_2)
    assert same_rank_places({"world_size": 2}, 2, DDP_2)


def test_an_old_state_takes_its_manifests_layout() -> None:
    """A pp 2 state saved before the trainer recorded its layout: the manifest's says pp 2, so a
    pp 2 resume keeps the RNG streams and a DDP resume on the same ranks does not."""
    old = {"world_size": 2, "tp": 1}
    manifest = {"pp": 2, "dp": 1, "tp": 1, "pp_groups": [[0, 1]]}
    assert same_rank_places(old, 2, PP_2, manifest)
    assert not same_rank_places(old, 2, DDP_2, manifest)
    assert not same_rank_places(old, 2, PP_2)  # no manifest layout: read as data parallel


def test_dropout_streams_differ_per_data_rank_and_stage_and_agree_within_tp() -> None:
    from hpcpipe.train.mesh import Layout, dropout_seed

    seeds = {
        (pp_rank, dp_rank, tp_rank): dropout_seed(
            7, Layout(dp=2, tp=2, dp_rank=dp_rank, pp=2, pp_rank=pp_rank)
        )
        for pp_rank in range(2)
        for dp_rank in range(2)
        for tp_rank in range(2)  # not a field: the tp ranks of a group share dp_rank and pp_rank
    }
    assert len(set(seeds.values())) == 4  # pp 2 x dp 2 streams; a stage drew stage 0's masks again
    assert all(seeds[(p, d, 0)] == seeds[(p, d, 1)] for p in range(2) for d in range(2))
