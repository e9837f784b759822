"""Pure planning of multi-device clients: the layout, batch shares, micro-batch slots, shard
rows, DisTrO owners, digest comparison and the torchrun environment."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from psyche_client.training.parallel.plan import (
    LaunchEnv,
    ParallelLaunchError,
    ParallelSpec,
    assign_owners,
    first_mismatch,
    micro_batch_slots,
    owned_elements,
    shard_rows,
    split_samples,
)


def test_spec_modes_and_validation() -> None:
    assert ParallelSpec().mode == "single"
    assert ParallelSpec(2).mode == "replicated"
    assert ParallelSpec(4, fsdp=True).mode == "sharded"
    assert ParallelSpec(4, fsdp=True).world_size == 4
    with pytest.raises(ValueError, match="data_parallelism must be >= 1"):
        ParallelSpec(0)
    with pytest.raises(ValueError, match=r"fsdp .* needs data_parallelism >= 2"):
        ParallelSpec(1, fsdp=True)


def test_split_gives_the_remainder_to_the_first_ranks() -> None:
    assert split_samples(5, 2) == [range(0, 3), range(3, 5)]
    assert split_samples(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert split_samples(1, 3) == [range(0, 1), range(1, 1), range(1, 1)]
    with pytest.raises(ValueError):
        split_samples(4, 0)


@given(st.integers(0, 200), st.integers(1, 9))
def test_split_covers_every_sample_once_in_order(count: int, ranks: int) -> None:
    shares = split_samples(count, ranks)
    assert [i for share in shares for i in share] == list(range(count))
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1


def test_slots_are_the_most_micro_batches_of_any_share() -> None:
    assert micro_batch_slots(5, 2, 2) == 2  # shares 3 (2+1) and 2 (2)
    assert micro_batch_slots(8, 2, 4) == 1
    assert micro_batch_slots(1, 4, 1) == 1  # three ranks idle in the one slot
    with pytest.raises(ValueError):
        micro_batch_slots(4, 2, 0)


@pytest.mark.parametrize(("rows", "ranks"), [(255, 2), (64, 2), (3, 4), (5, 4), (1, 2), (7, 7)])
def test_shard_rows_match_torch_chunk(rows: int, ranks: int) -> None:
    """`fully_shard` cuts dimension 0 like `torch.chunk`; ranks past the last chunk hold none."""
    chunks = torch.arange(rows).chunk(ranks)
    expected = [(int(c[0]), int(c[-1]) + 1) for c in chunks]
    expected += [(rows, rows)] * (ranks - len(chunks))
    assert shard_rows(rows, ranks) == expected


def test_owners_balance_whole_parameters() -> None:
    sizes = {"embed": 100, "head": 100, "a": 30, "b": 30, "c": 20, "norm": 1}
    owners = assign_owners(sizes, 2)
    assert owners == {"embed": 0, "head": 1, "a": 0, "b": 1, "c": 0, "norm": 1}
    assert owned_elements(owners, sizes, 2) == [150, 131]
    assert assign_owners(sizes, 1) == dict.fromkeys(sizes, 0)
    assert set(assign_owners({"x": 5}, 3).values()) == {0}  # more ranks than parameters


def test_first_mismatch_names_the_rank() -> None:
    assert first_mismatch([b"a", b"a", b"a"]) is None
    assert first_mismatch([b"a", b"a", b"b", b"c"]) == 2


def test_launch_env_from_torchrun_variables() -> None:
    assert LaunchEnv.from_env({}) is None
    assert LaunchEnv.from_env({"RANK": "0"}) is None
    env = LaunchEnv.from_env(
        {
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "MASTER_ADDR": "10.0.0.2",
            "MASTER_PORT": "29400",
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }
    )
    assert env == LaunchEnv(3, 4, 1, "10.0.0.2", 29400, agent_store=True)
    with pytest.raises(ParallelLaunchError, match="outside WORLD_SIZE"):
        LaunchEnv.from_env({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(ParallelLaunchError, match="malformed"):
        LaunchEnv.from_env({"RANK": "x", "WORLD_SIZE": "4"})
