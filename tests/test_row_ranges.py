"""``row_ranges``: the blocks of rows embedded or scored at a time."""

import pytest

from dslide_dask.data.csr import SCORE_ROWS, row_ranges


@pytest.mark.parametrize(
    "n_rows, size, blocks",
    [
        (0, 4, []),
        (1, 4, [(0, 1)]),
        (4, 4, [(0, 4)]),
        (9, 4, [(0, 4), (4, 8), (8, 9)]),
    ],
)
def test_blocks_cover_the_rows_in_order(n_rows, size, blocks):
    assert list(row_ranges(n_rows, size)) == blocks
    assert list(row_ranges(n_rows, size, at_least_one=True)) == (blocks or [(0, 0)])


def test_the_default_block():
    assert SCORE_ROWS == 4096
    assert list(row_ranges(SCORE_ROWS + 1)) == [(0, SCORE_ROWS), (SCORE_ROWS, SCORE_ROWS + 1)]
