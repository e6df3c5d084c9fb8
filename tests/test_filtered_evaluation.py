"""Labels left out of each row's answers before they are scored (the XC Repository's
``filter_labels_test.txt``): read with the file and line of a bad pair, applied to the
model's own answer by ``evaluate`` and ``dslide evaluate``, and no pairs score as no
filter on every path (the fused parts here, the network alone, a cluster's); ``dslide
predict --filter-labels`` writes each row's answers without its pairs."""

import json

import numpy as np
import pytest
import scipy.sparse as sp

from dslide_dask import SlideClassifier
from dslide_dask.data.dataset import spread_rows
from dslide_dask.data.label_pairs import pairs_matrix, read_label_pairs, read_pairs
from dslide_dask.data.xc_text import write_xc
from dslide_dask.errors import XCFormatError
from dslide_dask.metrics import drop_pairs, xc_metrics
from dslide_workflows.cli import main
from tests.conftest import no_pairs


def test_pairs_are_read_as_a_matrix_of_the_test_rows(tmp_path):
    path = tmp_path / "filter_labels_test.txt"
    path.write_text("0 5\n2 1\n\n0\t3\n0 5\n")
    pairs = read_label_pairs(str(path), 3, 6)
    assert pairs.indptr.tolist() == [0, 2, 2, 3] and pairs.indices.tolist() == [3, 5, 1]


@pytest.mark.parametrize(
    "text, says",
    [
        ("0 5\n1\n", ":2: expected two whole numbers 'row label', got '1'"),
        ("0 -5\n", ":1: expected two whole numbers"),
        ("0 1 2\n", ":1: expected two whole numbers"),
        ("3 1\n", ":1: row 3 is past the test set's 3 rows"),
        ("0 6\n", ":1: label 6 is past the model's 6 labels"),
    ],
    ids=["one-number", "negative", "three-numbers", "row-past", "label-past"],
)
def test_a_bad_pair_names_its_file_and_line(tmp_path, text, says):
    path = tmp_path / "pairs.txt"
    path.write_text(text)
    with pytest.raises(XCFormatError) as err:
        read_label_pairs(str(path), 3, 6)
    assert str(err.value).startswith(f"{path}{says}")


def test_a_row_number_too_large_for_any_input_names_its_line(tmp_path):
    """Before the input is counted (``dslide predict``) a row is bounded by the int64 keys
    the pairs are sorted by: not an overflow, nor a key that wraps."""
    path = tmp_path / "pairs.txt"
    path.write_text("0 1\n99999999999999999999999 2\n")
    with pytest.raises(XCFormatError, match=r"pairs.txt:2: row 9{23} is past the most ids"):
        read_pairs(str(path), 6)
    path.write_text(f"{(2**63 - 1) // 6} 2\n")  # its key would wrap: refused
    with pytest.raises(XCFormatError, match=r"pairs.txt:1: row \d+ is past the most ids"):
        read_pairs(str(path), 6)
    path.write_text(f"{(2**63 - 1) // 6 - 1} 5\n")  # the largest key there is
    assert read_pairs(str(path), 6).widest() == 1


def test_a_partitions_pairs_are_its_slice_of_the_file(tmp_path):
    """Read once, each pair once: a partition's rows, wherever it starts, get their own
    pairs (``dslide predict`` drops them on the worker that answers the partition)."""
    path = tmp_path / "pairs.txt"
    path.write_text("7 2\n0 5\n3 1\n0 5\n3 0\n9 4\n")
    pairs = read_pairs(str(path), 6)
    assert pairs.rows.tolist() == [0, 3, 3, 7, 9] and pairs.lines.tolist() == [2, 5, 3, 1, 6]
    part = pairs.rows_between(3, 8)  # rows 3..7 as rows 0..4
    assert part.indptr.tolist() == [0, 2, 2, 2, 2, 3] and part.indices.tolist() == [0, 1, 2]
    assert pairs.rows_between(10, 12).indptr.tolist() == [0, 0, 0]
    with pytest.raises(XCFormatError, match=r"pairs.txt:1: row 7 is past the input's 5 rows"):
        pairs.check_rows(5, "the input's")


def test_a_row_leaving_out_more_than_a_thousand_labels_is_refused(tmp_path, model, tiny):
    path = tmp_path / "pairs.txt"
    path.write_text("".join(f"1 {label}\n" for label in range(1001)))
    with pytest.raises(XCFormatError, match=r"pairs.txt: row 1 leaves 1,001 labels out .* 1,000"):
        read_label_pairs(str(path), 3, 2000)
    _, test = tiny  # 1,000 labels: a row leaving out all of them is within the bound
    every = pairs_matrix(
        np.zeros(test.n_labels, np.int64), np.arange(test.n_labels), len(test), test.n_labels
    )
    top = model.predict_topk(test.X, 5)
    top[0] = -1  # row 0 answers nothing
    got = model.evaluate(test.X, test.Y, exclude=every)
    assert got["P@1"] == pytest.approx(xc_metrics(top, test.Y, (1,))["P@1"], abs=1e-12)


def test_dropping_pairs_keeps_the_other_answers_in_their_order():
    rng = np.random.default_rng(0)
    top = np.stack([rng.permutation(50)[:12] for _ in range(40)])
    top[3, 9:] = -1  # a row with fewer answers
    rows, labels = rng.integers(0, 40, 200), rng.integers(0, 50, 200)
    got = drop_pairs(top, pairs_matrix(rows, labels, 40, 50), 5)
    pairs = set(zip(rows.tolist(), labels.tolist(), strict=True))
    for i, answers in enumerate(top.tolist()):
        want = [a for a in answers if a >= 0 and (i, a) not in pairs][:5]
        assert got[i].tolist() == want + [-1] * (5 - len(want))


@pytest.fixture(scope="module", params=["fused", "network alone"])
def model(request, tiny):
    train, _ = tiny
    alone = {"neighbours": 0} if request.param == "network alone" else {}
    return SlideClassifier(epochs=1, random_state=0, **alone).fit(train.X, train.Y)


def test_no_pairs_score_as_no_filter(model, tiny):
    _, test = tiny
    want = model.evaluate(test.X, test.Y)
    got = model.evaluate(test.X, test.Y, exclude=no_pairs(len(test), test.n_labels))
    assert {"P@1", "P@5", "nDCG@5", "PSP@1", "PSP@5", "PSnDCG@5"} <= set(got)
    assert got == pytest.approx({name: want[name] for name in got}, abs=1e-12)


def test_each_rows_first_answer_left_out_scores_its_next_five(model, tiny):
    _, test = tiny
    top = model.predict_topk(test.X, 6)
    first = pairs_matrix(np.arange(len(top)), top[:, 0], len(top), test.n_labels)
    indicator = sp.csr_matrix(  # as a pyxclib user holds it
        (np.ones(len(top)), first.indices, first.indptr), shape=(len(top), test.n_labels)
    )
    got = model.evaluate(test.X, test.Y, exclude=indicator)
    want = xc_metrics(top[:, 1:], test.Y, (1, 3, 5))
    assert got["P@1"] < model.evaluate(test.X, test.Y)["P@1"]
    assert {name: got[name] for name in want} == pytest.approx(want, abs=1e-12)


def test_predict_topk_leaves_each_rows_pairs_out(model, tiny):
    """The API's answer is the one ``evaluate`` scores: each row's k best of the labels
    it may answer, with their scores, widened as far as the row that drops most."""
    _, test = tiny
    ids, scores = model.predict_topk(test.X, 9, return_scores=True)
    rows = np.concatenate([np.arange(0, len(test), 3), [4, 4, 4, 4]])  # row 4: its top 4
    labels = np.concatenate([ids[::3, 0], ids[4, :4]])
    exclude = pairs_matrix(rows, labels, len(test), test.n_labels)
    top = model.predict_topk(test.X, 5, exclude=exclude)
    np.testing.assert_array_equal(top, drop_pairs(ids, exclude, 5))
    assert top[4].tolist() == ids[4, 4:9].tolist() and (top[1] == ids[1, :5]).all()
    got = model.predict_topk(test.X, 5, exclude=exclude, return_scores=True)
    np.testing.assert_array_equal(got[0], top)
    np.testing.assert_allclose(got[1][4], scores[4, 4:9], rtol=1e-5)
    want = xc_metrics(top, test.Y, (1, 5))
    got = model.evaluate(test.X, test.Y, ks=(1, 5), exclude=exclude)
    assert (got["P@1"], got["P@5"]) == pytest.approx((want["P@1"], want["P@5"]), abs=1e-12)
    with pytest.raises(ValueError, match=f"exclude has 3 rows, X {len(test):,}"):
        model.predict_topk(test.X, 5, exclude=no_pairs(3, test.n_labels))
    with pytest.raises(TypeError, match="exclude: cannot use str as a sparse matrix"):
        model.predict_topk(test.X, 5, exclude="filter_labels_test.txt")


def test_the_pairs_as_read_for_a_cluster_serve_the_api_too(model, tiny, tmp_path):
    """``read_pairs``' pairs (what ``predict_to_storage`` takes) answer as their matrix."""
    _, test = tiny
    top = model.predict_topk(test.X, 2)
    path = tmp_path / "pairs.txt"
    path.write_text("".join(f"{r} {top[r, 0]}\n" for r in range(0, len(test), 4)))
    pairs = read_pairs(str(path), test.n_labels)
    want = model.predict_topk(
        test.X, 5, exclude=read_label_pairs(str(path), len(test), test.n_labels)
    )
    np.testing.assert_array_equal(model.predict_topk(test.X, 5, exclude=pairs), want)
    got = model.evaluate(test.X, test.Y, exclude=pairs)
    assert got == model.evaluate(
        test.X, test.Y, exclude=read_label_pairs(str(path), len(test), test.n_labels)
    )
    path.write_text(f"0 1\n{len(test)} 2\n")
    with pytest.raises(
        XCFormatError, match=f"pairs.txt:2: row {len(test)} is past X's {len(test):,} rows"
    ):
        model.predict_topk(test.X, 5, exclude=read_pairs(str(path), test.n_labels))
    with pytest.raises(ValueError, match="exclude: pairs read for 7 labels, the model has"):
        model.predict_topk(test.X, 5, exclude=read_pairs(str(path), 7))


def test_pairs_of_other_rows_are_refused(model, tiny):
    _, test = tiny
    with pytest.raises(ValueError, match=f"exclude has 3 rows, Y {len(test):,}"):
        model.evaluate(test.X, test.Y, exclude=no_pairs(3, test.n_labels))


def test_dslide_evaluate_filter_labels_scores_as_the_api(model, tiny, tmp_path, capsys):
    _, test = tiny
    folder, test_url = str(tmp_path / "model"), str(tmp_path / "test.txt")
    model.save(folder)
    write_xc(test_url, test)
    rows = np.arange(0, len(test), 2)  # every other row's first answer left out
    labels = model.predict_topk(test.X, 1)[rows, 0]
    pairs = tmp_path / "filter_labels_test.txt"
    pairs.write_text("".join(f"{r} {label}\n" for r, label in zip(rows, labels, strict=True)))
    exclude = pairs_matrix(rows, labels, len(test), test.n_labels)
    want = SlideClassifier.load(folder).evaluate(test.X, test.Y, exclude=exclude)
    argv = ["evaluate", folder, test_url, "--filter-labels", str(pairs)]
    assert main([*argv, "--json", str(tmp_path / "m.json")]) == 0
    out = capsys.readouterr().out
    assert f"left out: {len(rows):,} row-label pairs" in out
    for name in ("P@1", "P@5", "PSP@5"):
        assert f"{name} {want[name]:.4f}" in out, (name, out)
    saved = json.loads((tmp_path / "m.json").read_text())
    assert saved["filter_labels"] == str(pairs) and saved["metrics"] == pytest.approx(want)
    kept = spread_rows(len(test), 101)  # --max-rows: the pairs of the rows scored
    sub = test.take(kept)
    some = SlideClassifier.load(folder).evaluate(sub.X, sub.Y, exclude=exclude.take_rows(kept))
    assert main([*argv, "--max-rows", "101", "--json", str(tmp_path / "m.json")]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["metrics"] == pytest.approx(some)
    assert some["P@1"] != pytest.approx(want["P@1"])  # other rows than the whole set's
    capsys.readouterr()
    pairs.write_text(f"0 {test.n_labels}\n")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    says = f"{pairs}:1: label {test.n_labels} is past the model's {test.n_labels:,} labels"
    assert err == [f"dslide: error: {says}"]


def test_dslide_predict_filter_labels_writes_the_answers_left(
    model, tiny, tmp_path, client, capsys
):
    """The pairs follow their rows over the input's part files, each row still answers k
    labels with their scores, and a row past the input leaves no output that looks done."""
    from dslide_dask.inference import read_predictions
    from dslide_dask.metrics import drop_scored_pairs

    _, test = tiny
    test = test.slice(0, 300)
    folder, inputs, out = str(tmp_path / "model"), tmp_path / "test", tmp_path / "out"
    model.save(folder)
    inputs.mkdir()
    write_xc(str(inputs / "part-0.txt"), test.slice(0, 120))  # rows 120.. in the second file
    write_xc(str(inputs / "part-1.txt"), test.slice(120, 300))
    top = SlideClassifier.load(folder).predict_topk(test.X, 3)
    rows = np.concatenate([np.arange(0, 300, 7), [250, 250]])  # row 250: its 2nd and 3rd
    labels = np.concatenate([top[np.arange(0, 300, 7), 0], top[250, 1:]])
    pairs = tmp_path / "filter_labels_test.txt"
    pairs.write_text("".join(f"{r} {label}\n" for r, label in zip(rows, labels, strict=True)))
    ids, scores = SlideClassifier.load(folder).predict_topk(test.X, 8, return_scores=True)
    want = drop_scored_pairs(ids, scores, pairs_matrix(rows, labels, 300, test.n_labels), 5)
    argv = ["predict", folder, str(inputs), str(out), "--filter-labels", str(pairs)]
    argv += ["--scheduler-address", client.scheduler.address, "--no-progress"]
    assert main(argv) == 0, capsys.readouterr().err
    assert f"left out: {len(rows):,} row-label pairs of {pairs}" in capsys.readouterr().out
    got = read_predictions(str(out))
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5)
    assert got[0].shape == (300, 5) and (got[0] >= 0).all()  # k answers still
    assert got[0][250, 0] == top[250, 0] and not np.isin(top[250, 1:], got[0][250]).any()
    assert top[7, 0] not in got[0][7]
    manifest = json.loads((out / "predictions.json").read_text())
    assert manifest["k"] == 5 and manifest["filter_labels"] == str(pairs)

    pairs.write_text("0 1\n300 2\n")  # row 300: past the 300 rows read
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dslide: error: {pairs}:2: row 300 is past the input's 300 rows"]
    assert not (out / "predictions.json").exists()  # the parts answer 6: not a finished output
    pairs.write_text("0 1\n1 x\n")  # read before a cluster is asked for
    assert main([*argv[:6], "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dslide: error: {pairs}:2: expected two whole numbers 'row label', got '1 x'"]


def test_dslide_evaluate_on_a_cluster_scores_as_in_this_process(
    model, tiny, tmp_path, client, capsys
):
    """Each worker scores its partitions (here two files, the pairs' rows offset across
    them) and only sums come back: the metrics are this process's, filtered or not."""
    _, test = tiny
    test = test.slice(0, 300)
    folder, inputs = str(tmp_path / "model"), tmp_path / "test"
    model.save(folder)
    inputs.mkdir()
    write_xc(str(inputs / "part-0.txt"), test.slice(0, 130))
    write_xc(str(inputs / "part-1.txt"), test.slice(130, 300))
    top = model.predict_topk(test.X, 1)[:, 0]
    pairs = tmp_path / "filter_labels_test.txt"
    pairs.write_text("".join(f"{r} {top[r]}\n" for r in range(0, 300, 3)))
    cluster = ["--scheduler-address", client.scheduler.address, "--no-progress"]
    p_at_1 = []
    for extra in ([], ["--filter-labels", str(pairs)]):
        got = []
        for where in ([], cluster):
            out = tmp_path / f"m{len(where)}.json"
            argv = ["evaluate", folder, str(inputs), *extra, *where, "--json", str(out)]
            assert main(argv) == 0, capsys.readouterr().err
            got.append(json.loads(out.read_text()))
        here, there = got
        assert here["rows"] == there["rows"] == 300
        assert set(here["metrics"]) == set(there["metrics"]) >= {"P@5", "PSP@5", "PSnDCG@5"}
        assert there["metrics"] == pytest.approx(here["metrics"], abs=1e-12)
        p_at_1.append(there["metrics"]["P@1"])
    assert p_at_1[1] < p_at_1[0]  # the pairs were left out
    pairs.write_text("0 1\n300 2\n")
    assert main(["evaluate", folder, str(inputs), "--filter-labels", str(pairs), *cluster]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dslide: error: {pairs}:2: row 300 is past the test set's 300 rows"]
    assert main(["evaluate", folder, str(inputs), "--max-rows", "10", *cluster]) == 2
    assert "--max-rows samples rows in this process" in capsys.readouterr().err
