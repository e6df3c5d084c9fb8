"""SlideClassifier as scikit-learn, dask-ml and the XC libraries' users meet it: the
estimator checks of the installed scikit-learn, model selection in-process and on a
current Dask client, pickling, input forms, and Dask collections."""

import pickle

import dask.array as da
import dask.bag as db
import numpy as np
import pytest
import scipy.sparse
import sklearn
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MaxAbsScaler
from sklearn.utils.estimator_checks import parametrize_with_checks
from sklearn.utils.validation import check_is_fitted

from dslide_dask import SlideClassifier
from dslide_dask.data.synthetic import make_synthetic
from dslide_dask.estimator import EXPECTED_FAILED_CHECKS, p_at_k_scorer

#: Small enough for the checks' toy data sets (a few dozen rows, 2-10 features).
SMALL = dict(
    hidden=(16,),
    K=2,
    L=4,
    range_pow=4,
    bin_size=4,
    min_active=8,
    max_active=64,
    threshold=1,
    epochs=10,
    batch_size=32,
    n_threads=1,
    lr=0.05,
)
NEW_TAGS = tuple(int(v) for v in sklearn.__version__.split(".")[:2]) >= (1, 6)
#: On 1.5 the expected failures travel as the ``_xfail_checks`` tag instead.
CHECK_KWARGS = {"expected_failed_checks": lambda _: EXPECTED_FAILED_CHECKS} if NEW_TAGS else {}


# partial_fit says in a line that it trains the network alone (tests/test_estimator.py)
@pytest.mark.filterwarnings("ignore::dslide_dask.errors.NetworkAloneWarning")
@parametrize_with_checks([SlideClassifier(**SMALL)], **CHECK_KWARGS)
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)


def test_every_expected_failure_names_a_real_check_and_why():
    from sklearn.utils import estimator_checks

    for name, reason in EXPECTED_FAILED_CHECKS.items():
        assert hasattr(estimator_checks, name), name
        assert len(reason) > 20


@pytest.fixture(scope="module")
def tiny():
    train, test = make_synthetic("tiny", seed=0)
    return _scipy(train.X), train.Y, test


FAST = dict(hidden=(32,), K=3, L=10, range_pow=8, lr=1e-2, batch_size=256, min_active=100)


def _scipy(csr):
    return scipy.sparse.csr_matrix((csr.values(), csr.indices, csr.indptr), shape=csr.shape)


def test_unfitted_use_is_not_fitted_error():
    clf = SlideClassifier()
    assert not hasattr(clf, "history_") and not hasattr(clf, "n_steps_")
    with pytest.raises(NotFittedError):
        check_is_fitted(clf)
    with pytest.raises(NotFittedError, match="not fitted yet"):
        clf.predict(np.zeros((2, 3)))


def test_numpy_parameters_random_state_and_repr():
    clf = SlideClassifier(
        epochs=np.int64(2),
        hidden=np.array([8, 4]),
        lr=np.float32(0.01),
        bin_size=np.int64(4),
        random_state=np.random.RandomState(0),
    )
    assert "hidden=array([8, 4])" in repr(clf)
    assert clf.config().hidden == (8, 4)
    X = scipy.sparse.random(60, 20, density=0.2, format="csr", random_state=0)
    Y = np.eye(5, dtype=int)[np.arange(60) % 5]
    clf.set_params(K=np.int64(2), L=np.int64(4), range_pow=4, min_active=4).fit(X, Y)
    assert clf.n_features_in_ == 20 and clf.epochs_done_ == 2
    # None draws a new seed each fit; an int is the seed; seed= is its alias
    assert SlideClassifier(seed=5).get_params()["random_state"] == 5
    assert "seed" not in SlideClassifier().get_params()
    with pytest.raises(ValueError, match="random_state must be"):
        SlideClassifier(random_state="x").fit(X, Y)
    with pytest.raises(ValueError, match=r"epochs must be an integer in \[1, "):
        SlideClassifier(epochs=0).fit(X, Y)


def test_predict_is_a_sparse_top_k_indicator_and_topk_is_positional(tiny):
    X, Y, test = tiny
    clf = SlideClassifier(**FAST).fit(X, _scipy(Y))
    Xt = _scipy(test.X)
    top = clf.predict_topk(Xt, 3)
    pred = clf.predict(Xt, 3)  # napkinXC's predict(X, top_k)
    assert scipy.sparse.issparse(pred) and pred.shape == (test.n_points, test.n_labels)
    assert (pred.sum(axis=1) == 3).all()
    np.testing.assert_array_equal(np.sort(top, axis=1), pred.indices.reshape(-1, 3))
    assert clf.predict(Xt).nnz == test.n_points
    with pytest.raises(TypeError):
        clf.predict_topk(Xt, 3, False)  # exact is keyword-only: no silent top-1
    lsh = clf.predict(Xt, top_k=5, exact=False)
    assert lsh.nnz <= 5 * test.n_points and lsh.has_sorted_indices
    with pytest.raises(ValueError, match=r"top_k must be an integer in \[1, 1000\], got 0"):
        clf.predict(Xt, 0)
    ids, scores = clf.predict_topk(Xt, 3, return_scores=True)  # napkinXC's top_k + scores
    np.testing.assert_array_equal(ids, top)
    assert scores.dtype == np.float32 and (np.diff(scores, axis=1) <= 0).all()


def test_multiclass_y_is_a_list_of_classes():
    rng = np.random.default_rng(0)
    X = rng.random((120, 6))
    y = ["ab"[i % 2] + str(i % 3) for i in range(120)]
    X[np.arange(120), np.arange(120) % 6] += 3  # learnable
    clf = SlideClassifier(**{**SMALL, "epochs": 20}).fit(X, y)
    assert sorted(clf.classes_) == sorted(set(y))
    pred = clf.predict(X)
    assert pred.shape == (120,) and set(pred) <= set(y)
    assert clf.predict_topk(X, 2).shape == (120, 2)
    assert clf.score(X, y) == pytest.approx(np.mean(pred == np.asarray(y)))
    with pytest.raises(ValueError, match="top_k must be 1"):
        clf.predict(X, 3)
    with pytest.raises(ValueError, match="exclude= leaves labels out of a multi-label model"):
        clf.predict_topk(X, 2, exclude=[[0]] * 120)
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        SlideClassifier(**SMALL).fit(X, rng.random(120))


@pytest.mark.slow
def test_grid_search_in_process_with_a_p_at_3_scorer(tiny):
    X, Y, _ = tiny
    grid = GridSearchCV(
        SlideClassifier(**FAST), {"hidden": [(16,), (32,)]}, scoring=p_at_k_scorer(3), cv=2
    ).fit(X, _scipy(Y))
    assert grid.best_params_["hidden"] in ((16,), (32,))
    assert 0 < grid.best_score_ <= 1
    scores = cross_val_score(
        make_pipeline(MaxAbsScaler(), SlideClassifier(**FAST)),
        X,
        Y.to_lists(),
        cv=2,
        scoring=p_at_k_scorer(1),
    )
    assert scores.shape == (2,)


def test_pickle_round_trip_in_process(tiny):
    X, Y, test = tiny
    clf = SlideClassifier(**FAST).fit(X, _scipy(Y))
    again = pickle.loads(pickle.dumps(clf))
    Xt = _scipy(test.X)
    np.testing.assert_array_equal(again.predict_topk(Xt, 5), clf.predict_topk(Xt, 5))


@pytest.mark.slow
def test_current_client_grid_search_and_pickling(tiny, client):
    X, Y, test = tiny
    X, Y = X[:2000], _scipy(Y)[:2000]
    grid = GridSearchCV(
        SlideClassifier(**FAST), {"hidden": [(16,), (32,)]}, scoring=p_at_k_scorer(3), cv=2
    ).fit(X, Y)
    best = grid.best_estimator_
    assert type(best.trainer_).__name__ == "DistributedTrainer"  # picked up the client
    assert pickle.loads(pickle.dumps(SlideClassifier(**FAST))).client is None
    with pytest.raises(TypeError, match=r"save\(url\)"):
        pickle.dumps(best)
    assert clone(SlideClassifier(client=client)).client is None  # an override, not a param
    local = SlideClassifier(**FAST, client=False).fit(X, Y)
    assert type(local.trainer_).__name__ == "LocalTrainer"
    best.close()


@pytest.mark.slow
def test_dask_arrays_of_sparse_chunks(tiny, client):
    X, Y, test = tiny
    Xs, Ys = X[:1500], _scipy(Y)[:1500]
    dX = da.from_array(Xs, chunks=(500, Xs.shape[1]), asarray=False)
    dY = da.from_array(Ys, chunks=(500, Ys.shape[1]), asarray=False)
    fitted = SlideClassifier(**FAST, client=False).fit(dX, dY)
    ref = SlideClassifier(**FAST, client=False).fit(Xs, Ys)
    Xt = _scipy(test.X)[:300]
    dXt = da.from_array(Xt, chunks=(100, Xt.shape[1]), asarray=False)
    np.testing.assert_array_equal(fitted.predict_topk(dXt, 5), ref.predict_topk(Xt, 5))
    assert fitted.score(dXt, da.from_array(_scipy(test.Y)[:300], asarray=False)) == pytest.approx(
        ref.score(Xt, _scipy(test.Y)[:300])
    )


def test_dask_bag_of_rows(tiny):
    X, Y, _ = tiny
    rows = [
        ({int(j): float(v) for j, v in zip(X[i].indices, X[i].data, strict=True)}, list(Y.row(i)))
        for i in range(400)
    ]
    clf = SlideClassifier(**FAST).fit(db.from_sequence(rows, npartitions=4))
    assert clf.n_features_in_ <= X.shape[1] and clf.n_steps_ == 2
    with pytest.raises(ValueError, match=r"\(x, labels\) pairs"):
        SlideClassifier(**FAST).fit(db.from_sequence([1, 2, 3]))


def _made_on_a_worker(block):
    """A chunk that refuses to be made outside a Dask worker (so a test can tell that
    nothing computed it in the client process)."""
    from distributed import get_worker

    get_worker()  # ValueError outside a worker
    return block


def _on_workers(matrix, rows: int):
    chunks = (rows, matrix.shape[1])
    return da.from_array(matrix, chunks=chunks, asarray=False).map_blocks(
        _made_on_a_worker, dtype=float
    )


@pytest.mark.slow
def test_dask_collections_on_a_cluster_stay_on_the_workers(tiny, client):
    X, Y, test = tiny
    Xs, Ys = X[:1500], _scipy(Y)[:1500]
    dX = _on_workers(Xs, 500)
    dY = _on_workers(Ys, 300)
    with pytest.raises(ValueError):
        dX.compute(scheduler="sync")  # the chunks really cannot be made here
    # the network alone: a neighbour index needs the rows where the estimator is
    fitted = SlideClassifier(**FAST, neighbours=0).fit(dX, dY)  # blocks kept on the workers
    ref = SlideClassifier(**FAST, neighbours=0).fit(Xs, Ys)  # the same from the client's rows
    assert type(fitted.trainer_).__name__ == "DistributedTrainer"
    assert fitted.n_features_in_ == Xs.shape[1] and len(fitted.classes_) == Ys.shape[1]
    Xt, Yt = _scipy(test.X)[:300], _scipy(test.Y)[:300]
    dXt = _on_workers(Xt, 100)
    dYt = _on_workers(Yt, 100)
    top = fitted.predict_topk(dXt, 5)
    assert isinstance(top, da.Array) and top.chunks == ((100, 100, 100), (5,))
    np.testing.assert_array_equal(top.compute(), ref.predict_topk(Xt, 5))
    assert fitted.score(dXt, dYt, k=3) == pytest.approx(ref.score(Xt, Yt, k=3))
    firsts = scipy.sparse.csr_matrix(  # rows 95-204's first answers left out, over three blocks
        (np.ones(110), top.compute()[95:205, 0], np.r_[np.zeros(96), np.arange(1, 111),
                                                       np.full(95, 110)].astype(int)),
        shape=(300, Yt.shape[1]),
    )  # fmt: skip
    kept = fitted.predict_topk(dXt, 5, exclude=firsts)
    assert isinstance(kept, da.Array) and kept.chunks == ((100, 100, 100), (5,))
    np.testing.assert_array_equal(kept.compute(), ref.predict_topk(Xt, 5, exclude=firsts))
    assert (kept.compute()[95:205, :4] == top.compute()[95:205, 1:]).all()
    ids, scores = fitted.predict_topk(Xt, 5, return_scores=True)  # scores from a cluster model
    np.testing.assert_array_equal(ids, ref.predict_topk(Xt, 5))
    assert (np.diff(scores, axis=1) <= 0).all()
    fitted.close()
    ref.close()


@pytest.mark.slow
def test_dask_bag_of_rows_on_a_cluster(tiny, client):
    X, Y, _ = tiny
    rows = [
        ({int(j): float(v) for j, v in zip(X[i].indices, X[i].data, strict=True)}, list(Y.row(i)))
        for i in range(400)
    ]
    clf = SlideClassifier(**FAST).fit(db.from_sequence(rows, npartitions=4))
    assert type(clf.trainer_).__name__ == "DistributedTrainer" and clf.n_steps_ == 2
    assert clf.n_features_in_ <= X.shape[1] and len(clf.classes_) <= Y.n_cols
    with pytest.raises(ValueError, match=r"\(x, labels\) pairs"):
        SlideClassifier(**FAST).fit(db.from_sequence([1, 2, 3], npartitions=1))
    clf.close()
