"""ShuffleImages' group count: every worker of the local runner gets the same number of groups."""

from __future__ import annotations

import pytest

from transforms.shuffle import GROUP_SIZE, group_count


@pytest.mark.parametrize("images", [1, 20, 2_000, 12_288, 12_289, 20_000, 1_000_000])
def test_group_count_splits_evenly_over_common_worker_counts(images):
    groups = group_count(images)
    for workers in (1, 2, 3, 4, 6, 8, 12, 16, 24, 48):
        assert groups % workers == 0, (images, groups, workers)


@pytest.mark.parametrize(("images", "groups"), [(1, 48), (2_000, 48), (12_288, 48), (12_289, 96), (20_000, 96)])
def test_group_count(images, groups):
    assert group_count(images) == groups


def test_groups_stay_near_the_target_size_for_large_datasets():
    groups = group_count(1_000_000)
    assert GROUP_SIZE * 0.9 <= 1_000_000 / groups <= GROUP_SIZE
