"""Witness reports the coordinator can prove false by itself, and the removal of their senders.

Two reports are lies on their face, with no other participant's word needed: a witness whose
blooms have more bits set than every entry of the round can set (`plausibility`: no honest
bloom can), and a health check that accuses a trainer whom a quorum of the previous round's
witnesses saw (`witnesses.healthy`: an honest client accuses only from those same stored
witnesses, which it reads from the broadcast). The coordinator refuses both, as before, and
now also counts them against their sender (`VerificationRecord.false_reports`, this epoch's
members only): an implausible bloom counts `FALSE_REPORT_LIMIT` at once (no timing can make
one), a refused accusation counts 1, so one stale health check of an honest client does not
remove it. A sender that reaches `FALSE_REPORT_LIMIT` is `Dropped` (it leaves at the next
round start and may join the next epoch, like a health-check drop). The counts are the
server's own: neither broadcast nor saved (a restart in the middle of an epoch forgets them).
"""

from __future__ import annotations

from psyche_common.coordinator.state import CoordinatorState
from psyche_common.coordinator.types import ClientState

FALSE_REPORT_LIMIT = 2
"""False reports (weighted) in one epoch that remove a member."""


def record_false_report(coord: CoordinatorState, reporter: bytes, weight: int = 1) -> bool:
    """Count a false report of `reporter`; True when this one removed it (made it Dropped).
    Reports of keys that are not members of the epoch are not counted (bounded memory)."""
    client = next((c for c in coord.epoch_state.clients if c.id == reporter), None)
    if client is None:
        return False
    counts = coord.verification.false_reports
    counts[reporter] = counts.get(reporter, 0) + weight
    if counts[reporter] < FALSE_REPORT_LIMIT or client.state != ClientState.Healthy:
        return False
    client.state = ClientState.Dropped
    return True
