"""Reloads of `--authorized-keys` with a fake clock: a change is applied only once it stayed
the same for a whole poll interval (a file written in two parts revokes nobody), SIGHUP applies
at once, and a file that does not load refuses every new Join (naming the file and the fault)
while the clients already admitted stay, until a valid file loads."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from psyche_common.protocol import Identity
from psyche_server.admission import POLL_INTERVAL, Admission, AuthorizedKeysFile
from psyche_server.file_watch import UNREADABLE, SettleWatch

RUN = "run-a"
A, B, C = (Identity.generate().public_key for _ in range(3))


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def write(path: Path, text: str, mtime_s: int) -> None:
    """Write `text` with the modification time `mtime_s` (a change is visible whatever the
    filesystem's timestamp granularity)."""
    path.write_text(text)
    os.utime(path, ns=(mtime_s * 10**9, mtime_s * 10**9))


def lines(*keys: bytes) -> str:
    return "".join(f"{key.hex()}\n" for key in keys)


def keys_file(tmp_path: Path) -> tuple[AuthorizedKeysFile, FakeClock, Path]:
    path, clock = tmp_path / "authorized_keys", FakeClock()
    write(path, lines(A, B), 100)
    keys = AuthorizedKeysFile(path, clock)
    keys.load()
    return keys, clock, path


def poll(keys: AuthorizedKeysFile, clock: FakeClock) -> bool:
    clock.now += POLL_INTERVAL
    return keys.reload_if_changed()


def test_the_watch_reads_a_change_seen_the_same_at_two_polls() -> None:
    watch = SettleWatch()
    watch.was_read((1, 10))
    assert not watch.poll((1, 10))  # unchanged
    assert not watch.poll((2, 5))  # changed: wait
    assert not watch.poll((3, 10))  # changed again: wait again
    assert watch.poll((3, 10))  # the same twice: read
    watch.was_read((3, 10))
    assert not watch.poll((3, 10))
    assert not watch.poll(UNREADABLE) and watch.poll(UNREADABLE)  # missing, and it stays so


def test_a_file_written_in_two_parts_revokes_nobody(tmp_path: Path) -> None:
    keys, clock, path = keys_file(tmp_path)
    gate = Admission(keys, lambda: 0.0)
    assert gate.admit(A, RUN, None) is None and gate.admit(B, RUN, None) is None
    whole = lines(A, B, C)
    write(path, whole[:65], 101)  # a poll sees the first part (A alone, a valid file)
    assert not poll(keys, clock)
    write(path, whole, 102)  # the rest lands before the next poll
    assert not poll(keys, clock)  # changed again since the last poll: not settled yet
    assert keys.keys == {A, B} and gate.revoked([A, B]) == []
    assert poll(keys, clock)  # unchanged for a whole interval: applied
    assert keys.keys == {A, B, C} and gate.revoked([A, B]) == []


def test_a_complete_change_is_applied_after_the_stability_poll(tmp_path: Path) -> None:
    keys, clock, path = keys_file(tmp_path)
    gate = Admission(keys, lambda: 0.0)
    assert gate.admit(B, RUN, None) is None
    assert not poll(keys, clock)  # unchanged
    write(path, lines(A), 101)
    clock.now += POLL_INTERVAL / 2
    assert not keys.reload_if_changed()  # not a poll yet
    clock.now += POLL_INTERVAL / 2
    assert not keys.reload_if_changed()  # a poll: the change is seen
    assert keys.keys == {A, B}
    assert poll(keys, clock)  # seen the same again: applied
    assert keys.keys == {A} and keys.reloads == 1 and gate.revoked([B]) == [B]
    assert not poll(keys, clock)  # nothing new


def test_sighup_applies_at_once(tmp_path: Path) -> None:
    keys, _, path = keys_file(tmp_path)
    write(path, lines(C), 101)
    assert keys.reload()
    assert keys.keys == {C}


def test_a_bad_file_refuses_new_joins_until_it_is_fixed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "psyche.server.admission")
    keys, clock, path = keys_file(tmp_path)
    gate = Admission(keys, lambda: 0.0)
    assert gate.admit(A, RUN, None) is None
    write(path, lines(A) + "not-a-key\n", 101)  # B removed, in a file that does not load
    assert not poll(keys, clock) and not poll(keys, clock)
    assert keys.error is not None and "line 2" in keys.error
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(path) in warnings[0].getMessage()
    for _ in range(3):  # warned once per change, not at every poll
        assert not poll(keys, clock)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    # the clients admitted stay (none revoked), and a repeated Join of one is no new Join
    assert keys.keys == {A, B} and gate.revoked([A]) == []
    assert gate.admit(A, RUN, None) is None
    # every new Join is refused, naming the file and the fault: a listed key as well as the
    # key the broken file removes
    for newcomer in (B, C):
        refusal = gate.admit(newcomer, RUN, None)
        assert refusal is not None and "authorized_keys" in refusal and "line 2" in refusal
        assert str(tmp_path) not in refusal  # the server's own paths stay on the server
    write(path, lines(A, C), 102)  # fixed
    assert not poll(keys, clock) and poll(keys, clock)
    assert keys.error is None and keys.keys == {A, C}
    assert "load again" in caplog.text
    assert gate.admit(C, RUN, None) is None
    assert gate.admit(B, RUN, None) is not None  # removed, now that the file loads


def test_a_missing_file_fails_closed_once_it_stays_missing(tmp_path: Path) -> None:
    keys, clock, path = keys_file(tmp_path)
    gate = Admission(keys, lambda: 0.0)
    path.unlink()  # an editor's rename: gone for a moment
    assert not poll(keys, clock)
    assert not poll(keys, clock) and keys.error is not None  # gone for two polls: refused
    refusal = gate.admit(C, RUN, None)
    assert refusal is not None and "No such file or directory" in refusal
    assert str(tmp_path) not in refusal
    write(path, lines(A, B), 103)
    assert not poll(keys, clock) and poll(keys, clock)
    assert keys.error is None and gate.admit(B, RUN, None) is None
    path.unlink()  # gone for good
    assert not poll(keys, clock) and not poll(keys, clock)
    assert keys.error is not None and keys.keys == {A, B}
    assert gate.admit(A, RUN, None) is not None  # A was never admitted: a new Join
    assert gate.admit(B, RUN, None) is None  # B was, and is still connected
