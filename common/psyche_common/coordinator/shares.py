"""Per-client batch shares from witnessed throughput (`[config] per_client_shares`, ours).

Evidence: every round witness times the results of the round it attests (`Witness.result_ms`:
per batch, the milliseconds from when the witness learned that round's batches to the first
verified result of the batch). When a round starts, the round now ending holds the witnesses
of the round before it; for each trainer of that attested round the times reported by its
witnesses are agreed by quorum: the lower median of the non-zero reports counts when at least
a witness quorum of reports lie within `TIME_TOLERANCE_MS` of it. The trainer's measured rate
is its share over that time (`RATE_SCALE` samples per millisecond); its `Client.rate` is the
rounded-down mean of the old rate and the new one (the first measurement is taken as is).

A trainer whose result no witness quorum saw (the health checks' rule) missed the round: its
rate is halved (an unmeasured one gets half the mean rate) and `Client.misses` counts the
misses in a row; it is forgiven, not dropped, until `MISS_LIMIT` of them (`forgiven`: the
coordinator refuses an accusation of a forgiven trainer, and honest witnesses make none).

A trainer cannot look faster than its result arrives; delaying its result only lowers its own
rate, and a minority of lying witnesses moves no median. The round's shares
(`Round.shares`) are then its batch split in proportion to the trainers' rates, an unmeasured
trainer (a new member) counting as the mean measured rate: integers that sum to the batch,
each at least 1 and at most `max_share_multiple` times the mean share (the largest-remainder
method, ties to the earlier trainer), so every client derives the same assignment from the
coordinator state. All arithmetic is on integers.
"""

from __future__ import annotations

from collections.abc import Sequence

from psyche_common.coordinator.assignment import (
    get_batch_size,
    round_batch_size,
    round_batches,
    round_trainers,
)
from psyche_common.coordinator.quorum import witness_quorum
from psyche_common.coordinator.state import CoordinatorState
from psyche_common.coordinator.types import NUM_STORED_ROUNDS, Round, Witness

RATE_SCALE = 1_000_000_000
"""A rate is samples per millisecond times this (micro-samples per second)."""
TIME_TOLERANCE_MS = 2_000
"""Witnessed times within this of their median agree."""
MISS_LIMIT = 3
"""Missed rounds in a row after which a trainer is dropped. A miss is known two rounds later
(when the next round's witnesses have reported), so the round after a missed one was already
assigned with the old share: the third miss in a row is the first round given the smaller
share that the trainer missed too."""


def agreed_time(reports: Sequence[int], quorum: int) -> int | None:
    """The lower median of the non-zero `reports` when at least `quorum` of them lie within
    `TIME_TOLERANCE_MS` of it; None otherwise."""
    times = sorted(t for t in reports if t > 0)
    if not times or len(times) < quorum:
        return None
    median = times[(len(times) - 1) // 2]
    agreeing = sum(1 for t in times if abs(t - median) <= TIME_TOLERANCE_MS)
    return median if agreeing >= quorum else None


def smoothed(old: int, measured: int) -> int:
    """The new rate: the measurement itself at first, then the mean with the old rate."""
    return measured if old == 0 else (old + measured) // 2


def share_sizes(rates: Sequence[int], batch_size: int, max_multiple: int) -> list[int]:
    """`batch_size` split in proportion to `rates` (0: the mean of the others), each share
    from 1 to `max_multiple` times the mean share; [] (the equal split) when no rate is known
    or there are more trainers than samples."""
    n = len(rates)
    known = [r for r in rates if r > 0]
    if n == 0 or batch_size < n or not known:
        return []
    mean_rate = max(1, sum(known) // len(known))
    weights = [r if r > 0 else mean_rate for r in rates]
    cap = max(-(-batch_size // n), max_multiple * batch_size // n)
    fixed: dict[int, int] = {}
    # pin the shares above the cap to it, then those below 1 to 1, re-dividing the rest
    for bound, sign in ((cap, 1), (1, -1)):
        while True:
            free = [i for i in range(n) if i not in fixed]
            budget = batch_size - sum(fixed.values())
            total = sum(weights[i] for i in free)
            if not free or total == 0:
                return []
            outside = [i for i in free if sign * (budget * weights[i] - bound * total) > 0]
            if not outside:
                break
            fixed.update(dict.fromkeys(outside, bound))
    sizes = [fixed.get(i, 0) for i in range(n)]
    for i in free:
        sizes[i] = budget * weights[i] // total
    left = budget - sum(sizes[i] for i in free)
    for i in sorted(free, key=lambda i: (-(budget * weights[i] % total), i))[:left]:
        sizes[i] += 1
    if sum(sizes) != batch_size or min(sizes) < 1 or max(sizes) > cap:
        return []  # cannot happen for valid inputs; the equal split is always valid
    return sizes


def _witnessed_times(witnesses: Sequence[Witness], batches: int, quorum: int) -> list[int | None]:
    """Per batch of the attested round, its agreed time (None: no agreement)."""
    reports = [w.result_ms for w in witnesses if len(w.result_ms) == batches]
    return [agreed_time([r[k] for r in reports], quorum) for k in range(batches)]


def update_rates(coord: CoordinatorState) -> None:
    """The round now ending: fold its witnesses' timings of the round before it into the
    rates of that round's trainers (skipped when members changed since that round)."""
    es = coord.epoch_state
    reporting = es.rounds[es.rounds_head]
    if reporting.height < 1 or not reporting.witnesses:
        return
    attested = es.rounds[(es.rounds_head - 1) % NUM_STORED_ROUNDS]
    clients = coord.round_clients(attested)
    if clients is None:
        return
    config = coord.config
    trainers = round_trainers(attested, clients, config)
    batches = round_batches(attested, round_batch_size(coord, attested), len(trainers))
    quorum = witness_quorum(config.witness_nodes, len(reporting.witnesses))
    times = _witnessed_times(reporting.witnesses, len(batches), quorum)
    by_id = {client.id: client for client in clients}
    missed = []
    for trainer, batch, elapsed in zip(trainers, batches, times, strict=False):
        client = by_id[trainer]
        if coord.trainer_health_score(trainer, reporting.witnesses) < quorum:
            missed.append(client)
            continue
        client.misses = 0
        if elapsed is not None:
            client.rate = smoothed(client.rate, len(batch) * RATE_SCALE // elapsed)
    known = [client.rate for client in clients if client.rate > 0]
    mean_rate = sum(known) // len(known) if known else 0
    for client in missed:  # after the others' updates: a first-round miss halves their mean
        client.misses = min(client.misses + 1, 0xFF)
        client.rate = (client.rate or mean_rate) // 2


def forgiven(coord: CoordinatorState, client_id: bytes) -> bool:
    """Whether a trainer that missed the round judged now is forgiven (per-client shares on
    and fewer than `MISS_LIMIT` misses in a row): its share shrank instead."""
    if not coord.config.per_client_shares:
        return False
    index = coord.client_index(client_id)
    return index is not None and coord.epoch_state.clients[index].misses < MISS_LIMIT


def assign_shares(coord: CoordinatorState, round_: Round) -> None:
    """Set `round_.shares` (a round that just started) from its trainers' rates."""
    config = coord.config
    clients = coord.epoch_state.clients
    trainers = round_trainers(round_, clients, config)
    rates = {client.id: client.rate for client in clients}
    batch_size = get_batch_size(config, round_.data_index * coord.model.max_seq_len)
    round_.shares = share_sizes([rates[t] for t in trainers], batch_size, config.max_share_multiple)
