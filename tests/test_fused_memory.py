"""The fused parts' bytes are counted before anything is built: estimated from the rows'
statistics (counted on the workers as here), planned on the worker that builds them, and
a run they would not fit is refused up front, naming the bytes."""

import numpy as np
import pytest

from dslide_dask import SlideConfig
from dslide_dask.data.source import open_source
from dslide_dask.data.synthetic import make_synthetic
from dslide_dask.data.xc_text import write_xc
from dslide_dask.distributed.placement import place_shards
from dslide_dask.errors import MemoryPlanError
from dslide_dask.fused_parts import row_stats
from dslide_dask.model.fused_build import recipe_from
from dslide_dask.model.fused_size import FusedBytes, RowStats, fused_bytes
from dslide_dask.model.label_tree import trees_for
from dslide_dask.model.neighbours import NeighbourIndex
from dslide_workflows.cli import main


@pytest.fixture(scope="module")
def small():
    train, _ = make_synthetic("tiny", seed=0)
    return train


def test_counted_on_the_cluster_as_in_one_process(small, tmp_path, client):
    url = str(tmp_path / "train.txt")
    write_xc(url, small)
    source = open_source(url, partition_bytes=64 << 10)  # several partitions, summed on the workers
    assert len(source.partitions) > 1
    here, there = row_stats(None, source), row_stats(client, source)
    assert here == there
    assert here.n_points == small.n_points and here.feature_nnz == small.X.indptr[-1]
    assert here.label_nnz == len(small.Y.indices)


def test_the_estimate_is_not_below_what_the_parts_take(small):
    """Errs towards refusing: the centroids and trees estimated from the counts are at
    least what they take once built (and not wildly more)."""
    stats = row_stats(None, small)
    index = NeighbourIndex.build(small.X, small.Y).with_centroids()
    n_trees = trees_for(small.Y.indices, small.n_labels)
    built = index.with_built_trees(0, n_trees, None)
    centroids = index.centroids
    cent = centroids.idx.nbytes + centroids.val.nbytes + centroids.ptr.nbytes
    trees = sum(a.nbytes for tree in built.trees for a in tree.state().values())
    est = fused_bytes(stats, 128, True, n_trees)
    assert cent <= est["centroids"] <= 4 * cent
    assert trees <= est["trees"] <= 4 * trees
    assert index.nbytes <= est["index"] <= 2 * index.nbytes


def test_a_run_whose_fused_parts_would_not_fit_is_refused_naming_them():
    cfg = SlideConfig(L=10, range_pow=10, bucket_capacity=16)
    workers = {f"tcp://10.0.0.{i}:1": {"nthreads": 1, "memory_limit": 2 << 30} for i in range(2)}
    stats = RowStats(2_000_000, 500_000, 3_000_000, 80_000_000, 60_000_000, 2_000_000_000)
    need = recipe_from({}).nbytes(stats, 128)
    assert need.last > 10 << 30 and need.trees > 0
    assert place_shards(workers, cfg, 30_000, n_features=1000).plan.fits
    with pytest.raises(MemoryPlanError) as refused:
        place_shards(workers, cfg, 30_000, n_features=1000, fused_bytes=need)
    message = str(refused.value)
    assert "over 80% of its limit" in message
    most = need.on(1, 2)  # the building worker's: the rest, and its piece of the trees
    assert f"neighbours=0 (the network alone, without the {most / 2**30:.2f} GiB" in message


def test_the_building_worker_takes_fewer_neurons_where_equal_shares_would_not_fit():
    cfg = SlideConfig(L=10, range_pow=10, bucket_capacity=16)
    workers = {f"tcp://10.0.0.{i}:1": {"nthreads": 1, "memory_limit": 2 << 30} for i in range(2)}
    placement = place_shards(
        workers, cfg, 300_000, n_features=1000, coordinator_load=0,
        fused_bytes=FusedBytes(900 << 20),
    )  # fmt: skip
    sizes = [placement.layout.size(s) for s in range(2)]
    assert placement.plan.fits and sizes[1] < sizes[0]
    assert placement.plan.workers[1].fused == 900 << 20 and placement.plan.workers[0].fused == 0


def test_the_label_trees_are_planned_in_pieces_on_every_worker():
    cfg = SlideConfig(L=10, range_pow=10, bucket_capacity=16)
    workers = {f"tcp://10.0.0.{i}:1": {"nthreads": 1, "memory_limit": 4 << 30} for i in range(3)}
    fused = FusedBytes(last=600 << 20, trees=900 << 20, problem=100 << 20)
    plan = place_shards(workers, cfg, 30_000, n_features=1000, fused_bytes=fused).plan
    assert [w.fused for w in plan.workers] == [400 << 20, 400 << 20, 1000 << 20]
    one = place_shards(dict(list(workers.items())[:1]), cfg, 30_000, fused_bytes=fused).plan
    assert one.workers[0].fused == 1500 << 20  # one worker builds the trees whole


def test_plan_estimates_a_file_from_its_first_rows(small, tmp_path, capsys):
    url = str(tmp_path / "train.txt")
    write_xc(url, small)
    assert main(["plan", "--train", url, "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert f"estimated from the first {small.n_points:,} rows" in out
    assert main(["plan", "--train", url, "--workers", "2", "--memory-limit", "700MiB"]) == 1
    out = capsys.readouterr().out
    assert "neighbours=0 (the network alone" in out, out
    np.testing.assert_equal(out.count("over 80% of its limit") >= 1, True)
