"""`ClientRoster`: the pending set (join order) and the P2P address book."""

from __future__ import annotations

from psyche_server.roster import ClientRoster

A, B, C = b"a" * 32, b"b" * 32, b"c" * 32


def test_join_keeps_join_order_and_reports_only_the_first_join() -> None:
    roster = ClientRoster()
    assert roster.join(B, "10.0.0.2:1")
    assert roster.join(A, "10.0.0.1:1")
    assert not roster.join(B, "10.0.0.2:2")  # a repeated Join updates the address
    assert list(roster.pending) == [B, A]
    assert roster.p2p_addresses[B] == "10.0.0.2:2"


def test_kick_keeps_the_address_and_leave_forgets_both() -> None:
    roster = ClientRoster()
    roster.join(A, "h:1")
    roster.join(B, "h:2")
    assert roster.kick([C, A]) == [A]
    assert list(roster.pending) == [B]
    assert roster.p2p_addresses == {A: "h:1", B: "h:2"}
    roster.leave(B)
    assert roster.pending == {} and roster.p2p_addresses == {A: "h:1"}


def test_peers_lists_members_with_known_addresses_only_never_pending_ones() -> None:
    roster = ClientRoster()
    roster.join(A, "h:1")
    roster.join(B, "h:2")
    roster.kick([A])
    assert roster.peers([A, C]) == {A: "h:1"}  # B is pending, C has no address
    assert roster.peers([B, A]) == {B: "h:2", A: "h:1"}


def test_a_dropped_record_is_kicked_once_so_a_rejoin_counts() -> None:
    """Regression: the dropped record stays in exited_clients until the next epoch starts,
    and kicking it at every tick undid every re-Join: a run whose clients were all dropped
    could never start another epoch."""
    roster = ClientRoster()
    a, b = b"a" * 32, b"b" * 32
    roster.join(a, "h:1")
    roster.join(b, "h:2")
    assert roster.kick_once([a]) == [a]
    assert list(roster.pending) == [b]
    roster.join(a, "h:1")  # the dropped client joins again
    assert roster.kick_once([a]) == []  # same record: not kicked again
    assert list(roster.pending) == [b, a]
    assert roster.kick_once([]) == []  # next epoch: the record is gone
    assert roster.kick_once([a]) == [a]  # dropped again in a later epoch: kicked again


def test_holders_are_the_pending_clients_whose_latest_join_said_they_hold_the_weights() -> None:
    roster = ClientRoster()
    roster.join(A, "10.0.0.1:1", holds_model=False)  # a restarted process: no weights yet
    roster.join(B, "10.0.0.2:1")
    assert roster.holders() == [B]
    roster.join(A, "10.0.0.1:1", holds_model=True)  # it loaded them and joined again
    assert roster.holders() == [A, B]
    roster.join(A, "10.0.0.1:1", holds_model=False)
    roster.leave(A)
    roster.join(A, "10.0.0.1:2")  # a new connection that holds them
    assert sorted(roster.holders()) == [A, B]
    roster.kick([B])
    assert roster.holders() == [A]
