"""Derived seeds (``dslide_dask/data/seeds.py``): part of the determinism contract of the
synthetic sets and the shuffled epochs, so their values are pinned."""

import pytest

from dslide_dask.data import seeds, shuffle, synthetic


@pytest.mark.parametrize(
    "parts, seed",
    [
        ((), 9600629759793949339),
        ((0,), 12561902727665508292),
        ((1, 2, 3), 2017494195059336020),
        ((0, 0, 1), 14943609135241049457),
        ((2**64 - 1, -1, 7), 10990140853647910222),
        ((-5,), 13770086761026020019),
    ],
)
def test_derived_seeds_do_not_change(parts, seed):
    assert seeds.derive_seed(*parts) == seed


def test_the_generator_and_the_shuffle_derive_seeds_alike():
    assert synthetic.derive_seed is shuffle.derive_seed is seeds.derive_seed
