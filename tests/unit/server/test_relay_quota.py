"""`psyche_server.relay_quota.PipeQuota`: pipes counted per key, per dialing address, per
address and target and in all, each refusal naming its limit; releasing gives the slot back."""

from __future__ import annotations

from psyche_server.relay_quota import PipeQuota, RelayLimits

LIMITS = RelayLimits(
    max_pipes=10, max_pipes_per_client=4, max_pipes_per_ip=6, max_pipes_per_ip_to_client=2
)


def key(n: int) -> bytes:
    return bytes([n]) * 32


def test_one_address_holds_few_pipes_to_one_client_whatever_its_keys() -> None:
    quota = PipeQuota(LIMITS)
    victim = key(0)
    quota.claim(key(1), victim, "10.0.0.9")
    quota.claim(key(2), victim, "10.0.0.9")
    refusal = quota.refusal(key(3), victim, "10.0.0.9")
    assert refusal is not None and "from 10.0.0.9 to 00000000" in refusal
    # another host still reaches the victim, up to the victim's own quota
    assert quota.refusal(key(4), victim, "10.0.0.1") is None
    quota.claim(key(4), victim, "10.0.0.1")
    quota.claim(key(5), victim, "10.0.0.2")
    refusal = quota.refusal(key(6), victim, "10.0.0.3")
    assert refusal is not None and "per-client limit of 4" in refusal
    assert quota.of_key(victim) == 4


def test_one_address_holds_few_pipes_in_all() -> None:
    quota = PipeQuota(LIMITS)
    for n in range(6):
        assert quota.refusal(key(n), key(100 + n), "10.0.0.9") is None
        quota.claim(key(n), key(100 + n), "10.0.0.9")
    refusal = quota.refusal(key(50), key(150), "10.0.0.9")
    assert refusal is not None and "--relay-max-pipes-per-ip 6" in refusal
    assert quota.refusal(key(50), key(150), "10.0.0.1") is None


def test_the_total_and_releases() -> None:
    quota = PipeQuota(LIMITS)
    claims = [quota.claim(key(n), key(100 + n), f"10.0.0.{n}") for n in range(10)]
    refusal = quota.refusal(key(60), key(160), "10.0.1.1")
    assert refusal is not None and "10 relay pipes open or pending" in refusal
    for claim in claims:
        quota.release(claim)
    assert quota.total == 0 and quota.of_key(key(0)) == 0 and quota.of_ip("10.0.0.0") == 0
    assert quota.refusal(key(60), key(160), "10.0.1.1") is None


def test_one_key_from_many_addresses_holds_few_pipes_to_a_victim_and_none_of_its_own() -> None:
    """The relay hog: one member key dialing a NATted victim from 4 addresses. It holds at
    most `max_pipes_per_pair` of the victim's incoming pipes, other keys still reach the
    victim, and the victim's own dials are charged to its outgoing budget only."""
    limits = RelayLimits(
        max_pipes=100,
        max_pipes_per_client=6,
        max_pipes_per_pair=3,
        max_pipes_per_ip=50,
        max_pipes_per_ip_to_client=16,
    )
    quota = PipeQuota(limits)
    hog, victim = key(1), key(0)
    held = 0
    for n in range(16):
        ip = f"10.0.{n % 4}.9"
        if quota.refusal(hog, victim, ip) is None:
            quota.claim(hog, victim, ip)
            held += 1
    assert held == 3
    refusal = quota.refusal(hog, victim, "10.0.9.9")
    assert refusal is not None and "at most 3 from one client to one client" in refusal
    # an honest peer still dials the victim, and the victim dials out as much as ever
    assert quota.refusal(key(2), victim, "10.0.5.5") is None
    for n in range(6):
        assert quota.refusal(victim, key(10 + n), "10.0.6.6") is None
        quota.claim(victim, key(10 + n), "10.0.6.6")
    refusal = quota.refusal(victim, key(30), "10.0.6.6")
    assert refusal is not None and "dialed by 00000000" in refusal
    assert quota.of_key(victim) == 9
