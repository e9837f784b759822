"""The authorization statement and the authorized-keys file (psyche_common.protocol.authorization),
the `authorize` command's expiry parsing and the Join's optional field."""

from __future__ import annotations

import pytest
from psyche_client.authorize_cli import check_expiry, parse_expiry
from psyche_common.protocol import Identity
from psyche_common.protocol.authorization import (
    AUTHORIZATION_DOMAIN,
    MAX_AUTHORIZATION_BYTES,
    MAX_DELEGATES,
    AuthorizationError,
    check_admission,
    decode_authorization,
    encode_authorization,
    parse_authorized_keys,
    sign_authorization,
)
from psyche_common.protocol.framing import encode_payload
from psyche_common.protocol.messages import InvalidMessage, Join, parse_client_message, to_wire

NOW = 1_800_000_000
RUN = "run-a"


@pytest.fixture
def authorizer() -> Identity:
    return Identity.from_secret_bytes(bytes(range(32)))


@pytest.fixture
def delegate() -> Identity:
    return Identity.from_secret_bytes(bytes([7] * 32))


def _statement(authorizer: Identity, delegate: Identity, **changes: object) -> bytes:
    args: dict[str, object] = {
        "run_id": RUN,
        "delegates": [delegate.public_key],
        "expires": NOW + 3600,
    }
    args.update(changes)
    return encode_authorization(sign_authorization(authorizer, **args))  # type: ignore[arg-type]


def test_good_delegation_is_admitted(authorizer: Identity, delegate: Identity) -> None:
    data = _statement(authorizer, delegate)
    listed = {authorizer.public_key}
    assert check_admission(delegate.public_key, RUN, listed, data, NOW) is None
    decoded = decode_authorization(data)
    assert decoded.authorizer == authorizer.public_key
    assert decoded.delegates == (delegate.public_key,)
    assert decoded.signing_bytes().startswith(AUTHORIZATION_DOMAIN)


def test_listed_key_needs_no_statement(delegate: Identity) -> None:
    assert check_admission(delegate.public_key, RUN, {delegate.public_key}, None, NOW) is None


def test_unlisted_key_without_statement_is_refused(delegate: Identity) -> None:
    reason = check_admission(delegate.public_key, RUN, set(), None, NOW)
    assert reason is not None and "not authorized" in reason and delegate.public_key.hex() in reason


def test_forged_signature_is_refused(authorizer: Identity, delegate: Identity) -> None:
    statement = decode_authorization(_statement(authorizer, delegate))
    intruder = Identity.generate()
    # the intruder adds itself to the delegates, keeping the authorizer's signature
    forged = encode_payload(
        {
            "version": 1,
            "run_id": RUN,
            "authorizer": authorizer.public_key,
            "delegates": [delegate.public_key, intruder.public_key],
            "expires": statement.expires,
            "signature": statement.signature,
        }
    )
    reason = check_admission(intruder.public_key, RUN, {authorizer.public_key}, forged, NOW)
    assert reason is not None and "signature does not verify" in reason


def test_signed_by_an_unlisted_key_is_refused(delegate: Identity) -> None:
    stranger = Identity.generate()
    data = _statement(stranger, delegate)
    reason = check_admission(delegate.public_key, RUN, {bytes(32)}, data, NOW)
    assert reason is not None and "not in the server's authorized keys" in reason


def test_wrong_run_is_refused(authorizer: Identity, delegate: Identity) -> None:
    data = _statement(authorizer, delegate, run_id="other-run")
    reason = check_admission(delegate.public_key, RUN, {authorizer.public_key}, data, NOW)
    assert reason is not None and "'other-run'" in reason


def test_expired_is_refused_naming_the_expiry(authorizer: Identity, delegate: Identity) -> None:
    data = _statement(authorizer, delegate, expires=NOW - 1)
    reason = check_admission(delegate.public_key, RUN, {authorizer.public_key}, data, NOW)
    assert reason is not None and "expired at 2027-01-15T07:59:59+00:00" in reason
    assert check_admission(delegate.public_key, RUN, {authorizer.public_key}, data, NOW - 2) is None


def test_key_not_among_delegates_is_refused(authorizer: Identity, delegate: Identity) -> None:
    other = Identity.generate()
    data = _statement(authorizer, delegate)
    reason = check_admission(other.public_key, RUN, {authorizer.public_key}, data, NOW)
    assert reason is not None and "not among the authorization's delegates" in reason


@pytest.mark.parametrize(
    ("data", "names"),
    [
        (b"\xc1", "not msgpack"),
        (encode_payload([1, 2]), "must be a msgpack map"),
        (encode_payload({"version": 1}), "missing"),
        (b"\x00" * (MAX_AUTHORIZATION_BYTES + 1), "at most"),
    ],
)
def test_malformed_statement_is_refused(data: bytes, names: str) -> None:
    with pytest.raises(AuthorizationError, match=names):
        decode_authorization(data)
    reason = check_admission(bytes(32), RUN, {bytes([1] * 32)}, data, NOW)
    assert reason is not None and reason.startswith("malformed authorization")


def test_malformed_fields_name_the_field(authorizer: Identity, delegate: Identity) -> None:
    good = decode_authorization(_statement(authorizer, delegate))
    fields = {
        "version": 1,
        "run_id": RUN,
        "authorizer": good.authorizer,
        "delegates": [b"short"],
        "expires": good.expires,
        "signature": good.signature,
    }
    with pytest.raises(AuthorizationError, match=r"delegates\[0\]"):
        decode_authorization(encode_payload(fields))
    with pytest.raises(AuthorizationError, match="version"):
        decode_authorization(encode_payload({**fields, "version": 2}))
    with pytest.raises(AuthorizationError, match="signature"):
        decode_authorization(
            encode_payload({**fields, "delegates": [delegate.public_key], "signature": b"x"})
        )
    with pytest.raises(AuthorizationError, match="delegates"):
        sign_authorization(authorizer, RUN, [bytes(32)] * (MAX_DELEGATES + 1), NOW)
    with pytest.raises(AuthorizationError, match="delegates"):
        sign_authorization(authorizer, RUN, [], NOW)


def test_largest_statement_fits_the_join(authorizer: Identity) -> None:
    keys = [Identity.generate().public_key for _ in range(MAX_DELEGATES)]
    data = encode_authorization(sign_authorization(authorizer, "r" * 32, keys, NOW))
    assert len(data) <= MAX_AUTHORIZATION_BYTES
    join = Join(run_id=RUN, p2p_address="127.0.0.1:1", authorization=data)
    assert parse_client_message(to_wire(join)) == join


def test_join_field_is_optional_and_bounded() -> None:
    join = Join(run_id=RUN, p2p_address="127.0.0.1:1")
    wire = to_wire(join)
    assert "authorization" not in wire  # what an older server reads
    assert parse_client_message(wire) == join
    with pytest.raises(InvalidMessage, match=r"Join\.authorization"):
        parse_client_message({**wire, "authorization": b"x" * (MAX_AUTHORIZATION_BYTES + 1)})


def test_authorized_keys_file(authorizer: Identity, delegate: Identity) -> None:
    text = (
        "# operators\n"
        f"{authorizer.public_key.hex()}  # alice\n"
        "\n"
        f"   {delegate.public_key.hex().upper()}\n"
    )
    assert parse_authorized_keys(text) == {authorizer.public_key, delegate.public_key}
    assert parse_authorized_keys("") == frozenset()


def test_authorized_keys_bad_line_is_named() -> None:
    with pytest.raises(AuthorizationError, match=r"keys.txt line 3: 'abc' is not a public key"):
        parse_authorized_keys(f"# x\n{'11' * 32}\nabc\n", "keys.txt")


def test_parse_expiry() -> None:
    assert parse_expiry("+90s", NOW) == NOW + 90
    assert parse_expiry("+7d", NOW) == NOW + 7 * 86400
    assert parse_expiry("2027-01-15T08:00:00Z", 0) == NOW
    assert parse_expiry("2027-01-15T08:00:00", 0) == NOW  # no zone: UTC
    with pytest.raises(ValueError, match="neither"):
        parse_expiry("tomorrow", NOW)


def test_check_expiry_refuses_the_past_and_beyond_year_9999() -> None:
    assert check_expiry("+7d", NOW) == NOW + 7 * 86400
    assert check_expiry("9999-12-31T23:59:59Z", NOW) > NOW
    with pytest.raises(ValueError, match="in the past"):
        check_expiry("2020-01-01", NOW)
    for far in ("+99999999w", "+1000000000000d"):
        with pytest.raises(ValueError, match="after 9999-12-31"):
            check_expiry(far, NOW)
