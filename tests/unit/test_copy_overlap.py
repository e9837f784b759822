"""The top-k index overlap that tells a copied result (`psyche_client.verify.copying`)."""

from __future__ import annotations

import numpy as np
import pytest
from psyche_client.verify.copying import index_overlap


def test_a_copy_overlaps_fully_whatever_the_order_within_a_chunk() -> None:
    a = [np.array([[1, 2, 3], [4, 5, 6]]), np.array([[0, 7, 9]])]
    shuffled = [np.array([[3, 1, 2], [6, 5, 4]]), np.array([[9, 0, 7]])]
    assert index_overlap(a, shuffled) == 1.0


def test_overlap_counts_positions_per_chunk() -> None:
    a = [np.array([[1, 2, 3], [4, 5, 6]])]
    b = [np.array([[1, 2, 8], [1, 2, 3]])]  # chunk 0 shares 2 of 3; chunk 1 shares none
    assert index_overlap(a, b) == pytest.approx(2 / 6)
    assert index_overlap(a, [np.array([[7, 8, 9], [7, 8, 9]])]) == 0.0


def test_results_of_other_layouts_cannot_be_compared() -> None:
    with pytest.raises(ValueError, match="tensors"):
        index_overlap([np.zeros((2, 3), dtype=np.int64)], [])
    with pytest.raises(ValueError, match="shapes"):
        index_overlap([np.zeros((2, 3), dtype=np.int64)], [np.zeros((3, 3), dtype=np.int64)])
