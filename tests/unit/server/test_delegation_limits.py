"""One listed key cannot mint an army: delegates per authorizer are capped across its
statements, long-lived statements are refused, listed keys are seated before delegates, and
the weights-hash majority counts one vote per listed key with its delegates."""

from __future__ import annotations

from pathlib import Path

from psyche_common.protocol import Identity
from psyche_common.protocol.authorization import encode_authorization, sign_authorization
from psyche_server.admission import DAY, Admission, AuthorizedKeysFile
from psyche_server.consistency import WeightsHashTracker

NOW = 1_800_000_000.0
RUN = "run-a"
AUTHORIZER, OTHER = Identity.generate(), Identity.generate()


def admission(tmp_path: Path, **limits: float) -> Admission:
    path = tmp_path / "keys"
    path.write_text(f"{AUTHORIZER.public_key.hex()}\n{OTHER.public_key.hex()}\n")
    keys = AuthorizedKeysFile(path)
    keys.load()
    return Admission(keys, lambda: NOW, **limits)  # type: ignore[arg-type]


def statement(delegates: list[Identity], expires: float = NOW + DAY) -> bytes:
    keys = [d.public_key for d in delegates]
    return encode_authorization(sign_authorization(AUTHORIZER, RUN, keys, int(expires)))


def test_the_delegates_of_one_authorizer_are_capped_across_its_statements(
    tmp_path: Path,
) -> None:
    gate = admission(tmp_path, max_delegates=3)
    army = [Identity.generate() for _ in range(6)]
    first, second = statement(army[:3]), statement(army[3:])  # two statements, one authorizer
    for member in army[:2]:
        assert gate.admit(member.public_key, RUN, first) is None
    assert gate.admit(army[3].public_key, RUN, second) is None
    refusal = gate.admit(army[4].public_key, RUN, second)
    assert refusal is not None and "already has 3 delegates" in refusal
    assert "--max-delegates-per-authorizer" in refusal
    assert gate.admit(army[1].public_key, RUN, first) is None  # a repeated Join is no new one
    gate.forget(army[0].public_key)  # one left: its slot is free again
    assert gate.admit(army[4].public_key, RUN, second) is None
    # listed keys are not delegates and are never capped
    assert gate.admit(OTHER.public_key, RUN, None) is None
    assert gate.delegates_of(AUTHORIZER.public_key) == {
        army[1].public_key,
        army[3].public_key,
        army[4].public_key,
    }


def test_a_statement_that_lives_too_long_is_refused(tmp_path: Path) -> None:
    gate = admission(tmp_path, max_lifetime=30 * DAY)
    delegate = Identity.generate()
    refusal = gate.admit(delegate.public_key, RUN, statement([delegate], 2**63 - 1))
    assert refusal is not None and "--max-authorization-days" in refusal
    assert gate.admit(delegate.public_key, RUN, statement([delegate], NOW + 29 * DAY)) is None


def test_listed_keys_are_seated_first_and_delegates_vote_with_their_authorizer(
    tmp_path: Path,
) -> None:
    gate = admission(tmp_path)
    delegates = [Identity.generate() for _ in range(3)]
    grant = statement(delegates)
    for member in delegates[:2]:
        assert gate.admit(member.public_key, RUN, grant) is None
    assert gate.admit(OTHER.public_key, RUN, None) is None
    assert gate.admit(delegates[2].public_key, RUN, grant) is None
    joined = [d.public_key for d in delegates[:2]] + [OTHER.public_key, delegates[2].public_key]
    assert gate.seat_order(joined) == [OTHER.public_key, *joined[:2], joined[3]]
    assert {gate.voter(d.public_key) for d in delegates} == {AUTHORIZER.public_key}
    assert gate.voter(OTHER.public_key) == OTHER.public_key


def test_an_authorizers_delegates_cast_one_vote_in_the_weights_majority() -> None:
    """Four delegates of one authorizer against two honest listed keys: two voters each side
    would be a tie without the listed keys, and the delegates alone never make a majority."""
    delegates = [bytes([1, i]) * 16 for i in range(4)]
    honest = [bytes([2, i]) * 16 for i in range(2)]
    voter = {**{d: b"authorizer" for d in delegates}, **{h: h for h in honest}}
    tracker = WeightsHashTracker(window=4)
    tracker.set_members([*delegates, *honest], voter.__getitem__)
    assert tracker.voters == 3
    tracker.advance(1)
    for d in delegates:
        tracker.record(1, d, b"forged")
    assert tracker.majority(1) is None  # one vote of three: no majority, nobody flagged
    assert tracker.divergent_clients() == frozenset()
    for h in honest:
        tracker.record(1, h, b"honest")
    assert tracker.majority(1) == b"honest"
    assert tracker.divergent_clients() == frozenset(delegates)
    # without voters (an open run), the four keys outvote the two
    open_run = WeightsHashTracker(window=4)
    open_run.set_members([*delegates, *honest])
    open_run.advance(1)
    for d in delegates:
        open_run.record(1, d, b"forged")
    assert open_run.majority(1) == b"forged"
    # a delegate leaving reweighs the others: the authorizer still has one vote
    tracker.forget(delegates[0])
    assert tracker.voters == 3 and tracker.majority(1) == b"honest"
