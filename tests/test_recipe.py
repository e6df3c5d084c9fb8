"""The training recipe: learning-rate schedule and early stopping with the best weights."""

import math

import numpy as np
import pytest

from dslide_dask import SlideClassifier
from dslide_dask.errors import NetworkAloneWarning
from dslide_dask.model.config import SlideConfig
from dslide_dask.model.optimizer import lr_factor, scheduled_lr

PARAMS = dict(hidden=(32,), K=3, L=10, range_pow=8, batch_size=128, seed=0, n_threads=2)


def test_cosine_warms_up_then_decays_to_the_floor():
    cfg = SlideConfig(lr=0.1, warmup_steps=10, stable_steps=0, decay_steps=110, lr_floor=0.1)
    assert lr_factor(cfg, 1) == pytest.approx(0.1)
    assert lr_factor(cfg, 10) == pytest.approx(1.0)
    assert lr_factor(cfg, 60) == pytest.approx(0.1 + 0.9 * 0.5)  # half way down
    assert lr_factor(cfg, 110) == pytest.approx(0.1)
    assert lr_factor(cfg, 500) == pytest.approx(0.1)  # past the end: stays at the floor
    assert scheduled_lr(cfg, 10) == pytest.approx(0.1)
    factors = [lr_factor(cfg, t) for t in range(10, 111)]
    assert all(a >= b for a, b in zip(factors, factors[1:], strict=False))


def test_linear_and_constant_schedules():
    linear = SlideConfig(lr_schedule="linear", decay_steps=100)
    assert lr_factor(linear, 25) == pytest.approx(0.75)
    assert lr_factor(linear, 100) == pytest.approx(0.0)
    constant = SlideConfig(lr_schedule="constant", decay_steps=100)
    assert {lr_factor(constant, t) for t in (1, 50, 100, 1000)} == {1.0}


def test_unknown_length_means_no_decay_until_a_fit_sets_it():
    cfg = SlideConfig(lr=0.1)
    assert cfg.decay_steps == 0 and lr_factor(cfg, 10_000) == 1.0
    fit = cfg.for_data(1000, steps=400, epoch_steps=100)
    assert (fit.decay_steps, fit.stable_steps) == (400, 100)
    given = SlideConfig(decay_steps=7, stable_steps=0).for_data(1000, 400, 100)
    assert (given.decay_steps, given.stable_steps) == (7, 0)  # given: kept
    assert SlideConfig(lr_schedule="constant").for_data(1000, 400, 100).decay_steps == 0


def test_the_first_epoch_is_at_full_lr_then_it_decays():
    cfg = SlideConfig(lr=0.1).for_data(1000, steps=300, epoch_steps=100)
    assert {lr_factor(cfg, t) for t in range(1, 101)} == {1.0}
    assert lr_factor(cfg, 200) == pytest.approx(0.5)
    assert lr_factor(cfg, 300) == pytest.approx(0.0)
    one_epoch = SlideConfig(lr=0.1).for_data(1000, steps=100, epoch_steps=100)
    assert {lr_factor(one_epoch, t) for t in range(1, 101)} == {1.0}


def test_lr_left_to_the_data_follows_the_number_of_labels():
    few, many = SlideConfig().for_data(26_556), SlideConfig().for_data(670_091)
    assert (few.lr, few.input_lr, few.output_lr) == (1e-2, 4e-2, 1e-2 / 8)
    assert (many.lr, many.input_lr, many.output_lr) == (2e-2, 16e-2, 2e-2 / 64)
    scaled = SlideConfig(lr=0.05).for_data(670_091)
    assert (scaled.input_lr, scaled.output_lr) == (0.4, 0.05 / 64)
    mine = SlideConfig(lr=0.05, input_lr=0.1, output_lr=0.01).for_data(670_091)
    assert (mine.lr, mine.input_lr, mine.output_lr) == (0.05, 0.1, 0.01)


def test_table_rebuilds_left_to_the_data_follow_the_number_of_labels():
    assert SlideConfig().for_data(26_556).rebuild_every == 50
    assert SlideConfig().for_data(670_091).rebuild_every == 200  # a rebuild hashes every row
    assert SlideConfig(rebuild_every=7).for_data(670_091).rebuild_every == 7
    # trees and centroids rank mostly rare labels: the network trains without retrieval
    assert SlideConfig().for_data(670_091, fused=True, rare=True).rebuild_every == 0
    assert SlideConfig().for_data(670_091, fused=True).rebuild_every == 200
    assert SlideConfig().for_data(670_091, rare=True).rebuild_every == 200
    shared = SlideConfig(negatives="shared").for_data(670_091, fused=True, rare=True)
    assert shared.rebuild_every == 200
    assert SlideConfig(rebuild_every=7).for_data(670_091, fused=True, rare=True).rebuild_every == 7


@pytest.mark.parametrize("used_labels, fused", [(40, 1000), (50_000, 60)])
def test_a_fit_with_neighbours_draws_fewer_negatives_for_the_network_they_rank(used_labels, fused):
    """From 100K labels each example draws its own negatives: 2,500 for a network that
    ranks alone, 1,000 for one whose candidates the neighbours and a tree rank, 60 when
    most training labels are of labels seen at most three times (50K used by 800)."""
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    X = sp.random(400, 60, density=0.1, format="csr", random_state=0, dtype=np.float32)
    labels = rng.integers(0, used_labels, 800)
    Y = sp.csr_matrix(
        (np.ones(800, np.float32), (np.repeat(np.arange(400), 2), labels)),
        shape=(400, 100_000),
    )
    drawn, rebuilds = {}, {}
    for k in (30, 0):
        clf = SlideClassifier(epochs=1, hidden=(16,), neighbours=k, client=False, random_state=0)
        cfg = clf.fit(X, Y).trainer_.network.cfg
        drawn[k], rebuilds[k] = cfg.min_active, cfg.rebuild_every
    assert drawn == {30: fused, 0: 2500}
    assert rebuilds == {30: 0 if fused == 60 else 200, 0: 200}  # 0: no retrieval
    given = SlideClassifier(epochs=1, hidden=(16,), min_active=700, client=False, random_state=0)
    assert given.fit(X, Y).trainer_.network.cfg.min_active == 700


@pytest.mark.parametrize(
    "params, message",
    [
        ({"lr_schedule": "step"}, r"lr_schedule must be one of \['cosine', 'linear', 'constant'\]"),
        ({"warmup_steps": -1}, r"warmup_steps must be an integer in \[0, "),
        ({"lr_floor": 1.5}, r"lr_floor must be a number in \[0\.0, 1\.0\], got 1\.5"),
    ],
)
def test_schedule_parameters_are_checked(params, message):
    with pytest.raises(ValueError, match=message):
        SlideConfig(**params)


@pytest.mark.slow
def test_fit_decays_lr_over_its_own_length(tiny):
    train, _ = tiny
    clf = SlideClassifier(lr=0.02, epochs=3, warmup_steps=3, **PARAMS).fit(train.X, train.Y)
    lrs = [h["lr"] for h in clf.history_]
    # rows held out to weigh the neighbours are not stepped on
    epoch = math.ceil(clf.n_network_rows(train.n_points) / PARAMS["batch_size"])
    assert len(lrs) == 3 * epoch
    assert lrs[0] == pytest.approx(0.02 / 3)
    assert lrs[3 : 3 + epoch] == [0.02] * epoch  # warm-up, then the first epoch at lr
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)
    assert all(a >= b for a, b in zip(lrs[3 + epoch :], lrs[4 + epoch :], strict=False))
    cfg = clf.trainer_.network.cfg
    assert (cfg.decay_steps, cfg.stable_steps) == (3 * epoch, epoch)


def test_partial_fit_keeps_lr_constant(tiny):
    train, _ = tiny
    with pytest.warns(NetworkAloneWarning):
        clf = SlideClassifier(lr=0.02, **PARAMS).partial_fit(train.X, train.Y)
    assert {h["lr"] for h in clf.history_} == {0.02}


@pytest.mark.slow
def test_early_stopping_restores_the_best_epoch(tiny):
    """A constant, too high lr makes validation P@1 wander; the model fit() leaves must be
    the best epoch's, not the last one's."""
    train, _ = tiny
    clf = SlideClassifier(
        lr=0.2,
        input_lr=0.2,
        output_lr=0.2,
        lr_schedule="constant",
        epochs=6,
        early_stopping=True,
        n_iter_no_change=6,
        validation_fraction=0.2,
        neighbours=0,
        **PARAMS,  # the network's
    ).fit(train.X, train.Y)
    scores = clf.validation_scores_
    assert len(scores) == clf.n_iter_ == 6
    assert int(np.argmax(scores)) < 5, f"the last epoch was the best, nothing to test: {scores}"
    assert clf.best_validation_score_ == max(scores)
    order = np.random.default_rng([PARAMS["seed"], 0x5EED]).permutation(train.n_points)
    held_out = train.take(np.sort(order[: round(0.2 * train.n_points)]))
    assert clf.score(held_out.X, held_out.Y) == pytest.approx(max(scores))


def test_early_stopping_stops_after_n_iter_no_change(tiny):
    train, _ = tiny
    clf = SlideClassifier(
        lr=0.2,
        lr_schedule="constant",
        epochs=30,
        early_stopping=True,
        n_iter_no_change=1,
        tol=0.5,
        **PARAMS,
    ).fit(train.X, train.Y)
    assert clf.n_iter_ == 2  # the first epoch improves on nothing; the second not by 0.5
    assert clf.epochs_done_ == 2


@pytest.mark.parametrize(
    "params, message",
    [
        ({"validation_fraction": 1.0}, r"validation_fraction must be a number in \(0\.0, 1\.0\)"),
        ({"validation_fraction": 1e-9}, r"leaves 0 to validate on"),
        ({"n_iter_no_change": 0}, r"n_iter_no_change must be an integer in \[1, "),
        ({"tol": -1}, r"tol must be a number in \[0\.0, 1\.0\], got -1"),
    ],
)
def test_early_stopping_parameters_are_checked(tiny, params, message):
    train, _ = tiny
    with pytest.raises(ValueError, match=message):
        SlideClassifier(early_stopping=True, **{**PARAMS, **params}).fit(train.X, train.Y)


def test_early_stopping_from_a_url_needs_an_eval_set(tmp_path, tiny):
    from dslide_dask.data.xc_text import write_xc

    train, _ = tiny
    url = str(tmp_path / "train.txt")
    write_xc(url, train.slice(0, 200))
    with pytest.raises(ValueError, match="early_stopping with training data from a URL or Dask"):
        SlideClassifier(early_stopping=True, **PARAMS).fit(url)
