"""``dslide bench topk``: the whole fused answer timed, exact and through its indexes."""

import json

import numpy as np
import pytest

from dslide_dask import SlideClassifier
from dslide_dask.data.csr import CSR
from dslide_dask.data.synthetic import make_synthetic
from tests.test_neighbours import PARAMS


@pytest.fixture(scope="module")
def small():
    return make_synthetic("tiny", seed=0)


def test_bench_topk_times_the_whole_fused_answer(small, tmp_path):
    pytest.importorskip("faiss", reason='the output index needs faiss: pip install -e ".[test]"')
    from dslide_dask.data.xc_text import write_xc
    from dslide_workflows.cli import main

    train, test = small
    clf = SlideClassifier(epochs=1, client=False, **PARAMS).fit(train.X, train.Y)
    model = clf.build_index(lists=16).save(str(tmp_path / "model"))  # "exact" drops it
    clf.drop_index()
    write_xc(str(tmp_path / "test.txt"), test.slice(0, 40))
    out = tmp_path / "bench.json"
    argv = ["bench", "topk", "--model", model, "--data", str(tmp_path / "test.txt")]
    argv += ["--setting", "0:0", "--latency-rows", "3", "--repeat", "1", "--json", str(out)]
    assert main(argv) == 0
    rows = {r["setting"]: r for r in json.loads(out.read_text())["results"]}
    exact, served = rows["fused exact"], rows["fused, indexes"]
    assert exact["recall"] == 1.0 and 0.0 <= served["recall"] <= 1.0 and served["build_s"] > 0
    want = clf.predict_topk(test.X.slice_rows(0, 40), 5)  # answered as the estimator does
    assert exact["P@1"] == pytest.approx(float(np.mean(_hit_at_1(want, test.Y))))
    assert exact["latency_ms_p50"] > 0 and served["rows_per_s"] > 0
    assert main([*argv, "--no-index", "--no-fused"]) == 0
    settings = [r["setting"] for r in json.loads(out.read_text())["results"]]
    assert settings == ["exact", "0:0"]


def _hit_at_1(top: np.ndarray, Y: CSR) -> list[bool]:
    return [top[i, 0] in set(Y.row(i)) for i in range(len(top))]
