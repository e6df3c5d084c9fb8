"""A row's votes: its neighbours' labels summed and ranked as an array over every label
summed and ranked them."""

import numpy as np
import pytest

from dslide_dask.kernels import neighbours as kernels
from tests.test_neighbours import _random_csr


@pytest.mark.parametrize("m", [3, 40])
def test_a_vote_keeps_the_first_voted_label_first_on_a_tie(m):
    """:func:`kernels._vote` (labels sorted, not an array over every label) gives the top
    ``m`` of summing each label's votes in the neighbours' order, the labels taken in
    the order first voted for (``topk._push``): ties and the cut at ``m`` included."""
    from dslide_dask.kernels.topk import _push

    rng = np.random.default_rng(9)
    Y = _random_csr(rng, 50, 30, 4, binary=True)
    nb_ids = np.array([7, 3, 12, 3, 40, 9, -1, -1], np.int64)
    nb_sims = np.array([0.5, 0.25, 0.25, 0.125, 0.125, 0.0625, 0, 0], np.float32)  # ties
    ids, shares = np.full(m, -1, np.int64), np.zeros(m, np.float32)
    scratch = kernels._vote_scratch(Y.indptr, len(nb_ids), m)[2]
    kernels._vote(nb_ids, nb_sims, Y.indptr, Y.indices, scratch, ids, shares)
    votes: dict[int, np.float32] = {}  # in the order first voted for
    for pt, w in zip(nb_ids[:6], nb_sims[:6], strict=True):
        for lab in Y.indices[Y.indptr[pt] : Y.indptr[pt + 1]]:
            votes[int(lab)] = np.float32(votes.get(int(lab), np.float32(0)) + w)
    want_ids, want = np.full(m, -1, np.int64), np.full(m, -np.inf, np.float32)
    for lab, v in votes.items():
        _push.py_func(want_ids, want, lab, v)
    np.testing.assert_array_equal(ids, want_ids)
    kept = want_ids >= 0
    np.testing.assert_allclose(shares[kept], want[kept] / np.float32(nb_sims.sum()), rtol=1e-6)


def test_neighbours_holding_more_labels_than_the_scratch_room_vote_the_same():
    """A row whose neighbours hold more labels than the chunk's scratch has room for
    (``VOTE_ROOM`` a point) takes more, and votes as with room to spare."""
    rng = np.random.default_rng(4)
    Y = _random_csr(rng, 20, 200, 60, binary=True)
    nb_ids = np.array([*np.argsort(-np.diff(Y.indptr))[:3], -1], np.int64)  # the most
    nb_sims = np.array([0.5, 0.3, 0.2, 0], np.float32)
    assert np.diff(Y.indptr)[nb_ids[:3]].sum() > kernels.VOTE_ROOM * len(nb_ids)
    room = int(np.diff(Y.indptr).max()) * len(nb_ids)
    roomy = (np.empty(room, np.int64), np.empty(room, np.float32))
    tight = kernels._vote_scratch(Y.indptr, len(nb_ids), 50)[2]
    votes = []
    for scratch in (tight, (*roomy, *tight[2:])):
        ids, shares = np.full(50, -1, np.int64), np.zeros(50, np.float32)
        kernels._vote(nb_ids, nb_sims, Y.indptr, Y.indices, scratch, ids, shares)
        votes.append((ids, shares))
    np.testing.assert_array_equal(votes[0][0], votes[1][0])
    np.testing.assert_array_equal(votes[0][1], votes[1][1])
