"""One vote per voter, shared by the keys that vote with it (pure).

In a permissioned run a delegate votes with the listed key that authorized it (the server's
`CoordinatorState.authorizers`: member → authorizer, delegates only); every other key is its
own voter. Where a majority of keys decides (the joiner's manifest vote, the Warmup weights
check), `voter_weights` gives each key an exact fraction of its voter's one vote, so a listed
key with many delegates weighs what one listed key weighs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from fractions import Fraction


def voter_of(authorizers: Mapping[bytes, bytes], key: bytes) -> bytes:
    """Whose vote `key` casts: its authorizer's when it is a delegate, else its own."""
    return authorizers.get(key, key)


def voter_weights(
    keys: Iterable[bytes], authorizers: Mapping[bytes, bytes]
) -> tuple[dict[bytes, Fraction], int]:
    """Each of `keys`' share of its voter's vote, and the number of distinct voters."""
    unique = list(dict.fromkeys(keys))
    groups = Counter(voter_of(authorizers, key) for key in unique)
    weights = {key: Fraction(1, groups[voter_of(authorizers, key)]) for key in unique}
    return weights, len(groups)
