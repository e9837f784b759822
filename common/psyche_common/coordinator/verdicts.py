"""Value types of verification: pending reports, the epoch's tallies, the kept convictions.

`Accusation`: a round's verifier says the result of `trainer` for `batch` at `step` (the
commitment `commitment`, when the verifier names it) does not match its recomputation
(`agreement_milli`: the measured sign agreement in thousandths). `Attestation`: the same
report for a result that does match. `Conviction`: a client removed from an epoch, of one of
four kinds (`ConvictionKind`): a trainer that verifiers of at least two different keys
accused, an accuser whom other verifiers refuted, a passer whom other verifiers outvoted, or a
client convicted by self-proving evidence. Every client skips a convicted client's results from `step` on in that epoch; only a
proven conviction also keeps the key out of later epochs (`banned`). `VerificationRecord`
holds them: `convictions`, those of the current epoch (at most `MAX_CONVICTIONS`, the oldest
forgotten first), which the coordinator broadcasts with its state, and `bans`, every key
convicted on proof (at most `MAX_BANS`, never evicted: when full, a further proven conviction
holds for its epoch only), which only the server keeps, saves and checks at admission. An
attacker thus cannot un-ban a key by getting others convicted. The server saves both
(`to_toml` / `from_toml`, where ids are hex; files from before `bans` existed kept proven
convictions among `convictions`, and load as bans). docs/verification.md states the rules.

The epoch's strikes (`Strikes`: trainer → accusing verifier → the steps of its standing
accusations) travel twice on the wire: `strike_steps` in full, and `strikes` as trainer → its
accusers, the shape that coordinators before the step rule sent and their clients decode. A
broadcast without `strike_steps` loads its `strikes` as strikes at no known step.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from psyche_common.batch_id import BatchId
from psyche_common.client_id import short_id
from psyche_common.coordinator.types import check_client_id
from psyche_common.wire_checks import wire_list, wire_map, wire_uint

MAX_CONVICTIONS = 256
"""Convictions of the current epoch kept in the record and broadcast (the oldest are forgotten
first; a proven one also stays in `VerificationRecord.bans`)."""

MAX_BANS = 16_384
"""Keys banned on proof that the server keeps (`VerificationRecord.bans`), never evicted; each
needs a key seated as a trainer and proven to equivocate. A saved ban is about 300 bytes of
TOML, so a full list is about 5 MB of state file."""

MAX_ACCUSATIONS = 1024
"""Pending reports (accusations, and attestations) held at once (two rounds' worth is far
below this)."""

MAX_TALLIES = 1024
"""Keys with an entry in an epoch's tallies (`strikes`, `refuted_by`); each entry names at
most that many verifiers (members are far fewer), and each verifier's strikes name at most
that many steps (the coordinator keeps `MIN_STRIKE_STEPS`, all a verdict needs)."""

REFUSED_STEPS = 16
"""Steps whose refused results (`VerificationRecord.refused`) the record keeps: the newest;
a step's results are applied one or two rounds after it closes, far inside this."""

Strikes = dict[bytes, dict[bytes, set[int]]]
"""Trainer → verifier → the steps at which that verifier's accusation of it stood."""


class ConvictionKind(enum.StrEnum):
    VERIFIERS = "verifiers"
    """Verifiers of at least two different keys accused the trainer, each time with the
    other checkers of that batch not contradicting them (epoch-scoped)."""
    FALSE_ACCUSER = "false_accuser"
    """A verifier whose accusations verifiers of at least two other keys refuted by passing
    the very result it accused (epoch-scoped)."""
    FALSE_PASSER = "false_passer"
    """A verifier whose passes verifiers of at least two other keys outvoted by accusing the
    very result it passed (epoch-scoped)."""
    PROVEN = "proven"
    """Self-proving evidence, such as two signed, conflicting commitments (equivocation):
    the key is not admitted again, in any later epoch."""


def _agreement(data: dict[str, Any], what: str) -> int:
    value = wire_uint(data, "agreement_milli", what)
    if value > 1000:
        raise ValueError(f"{what}.agreement_milli must be at most 1000, got {value}")
    return value


def _commitment(data: dict[str, Any], what: str) -> bytes | None:
    value = data.get("commitment")
    if value is None:
        return None
    if not isinstance(value, bytes) or len(value) != 32:
        raise ValueError(f"{what}.commitment must be 32 bytes")
    return value


@dataclass(frozen=True)
class Accusation:
    step: int
    verifier: bytes
    trainer: bytes
    batch: BatchId
    agreement_milli: int
    commitment: bytes | None = None
    """The data hash of the result scored (None from clients that do not send it: such an
    accusation can still stand, but no attestation can refute it)."""

    def __str__(self) -> str:
        return (
            f"{short_id(self.verifier)} accuses {short_id(self.trainer)} of {self.batch} at step "
            f"{self.step} (agreement {self.agreement_milli / 1000:.3f})"
        )

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "step": self.step,
            "verifier": self.verifier,
            "trainer": self.trainer,
            "batch": self.batch.to_wire(),
            "agreement_milli": self.agreement_milli,
        }
        if self.commitment is not None:
            wire["commitment"] = self.commitment
        return wire

    @classmethod
    def from_wire(cls, data: Any) -> Accusation:
        data = wire_map(data, "accusation")
        return cls(
            step=wire_uint(data, "step", "accusation"),
            verifier=check_client_id(data.get("verifier"), "accusation.verifier"),
            trainer=check_client_id(data.get("trainer"), "accusation.trainer"),
            batch=BatchId.from_wire(data.get("batch")),
            agreement_milli=_agreement(data, "accusation"),
            commitment=_commitment(data, "accusation"),
        )


@dataclass(frozen=True)
class Attestation:
    """A verifier checked the result `commitment` of `trainer` for `batch` at `step` and found
    it agrees with its recomputation (at or above the threshold)."""

    step: int
    verifier: bytes
    trainer: bytes
    batch: BatchId
    agreement_milli: int
    commitment: bytes

    def __str__(self) -> str:
        return (
            f"{short_id(self.verifier)} passes {short_id(self.trainer)} for {self.batch} at step "
            f"{self.step} (agreement {self.agreement_milli / 1000:.3f})"
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "verifier": self.verifier,
            "trainer": self.trainer,
            "batch": self.batch.to_wire(),
            "agreement_milli": self.agreement_milli,
            "commitment": self.commitment,
        }

    @classmethod
    def from_wire(cls, data: Any) -> Attestation:
        data = wire_map(data, "attestation")
        commitment = _commitment(data, "attestation")
        if commitment is None:
            raise ValueError("attestation.commitment is missing")
        return cls(
            step=wire_uint(data, "step", "attestation"),
            verifier=check_client_id(data.get("verifier"), "attestation.verifier"),
            trainer=check_client_id(data.get("trainer"), "attestation.trainer"),
            batch=BatchId.from_wire(data.get("batch")),
            agreement_milli=_agreement(data, "attestation"),
            commitment=commitment,
        )


@dataclass(frozen=True)
class Conviction:
    epoch: int
    step: int
    trainer: bytes
    batch: BatchId
    verifiers: tuple[bytes, ...]
    """Its accusers (for a false accuser: the verifiers that refuted it; proven: who sent the
    evidence)."""
    agreement_milli: int
    """The lowest agreement its accusers measured (a false accuser: what it claimed)."""
    kind: ConvictionKind = ConvictionKind.VERIFIERS
    """`trainer` is the convicted key whatever the kind (for a false accuser: the verifier)."""

    def __str__(self) -> str:
        accusers = ", ".join(short_id(v) for v in self.verifiers)
        what = {
            ConvictionKind.VERIFIERS: f"for {self.batch} by {accusers}",
            ConvictionKind.FALSE_ACCUSER: f"as a false accuser of {self.batch}, refuted by "
            f"{accusers}",
            ConvictionKind.FALSE_PASSER: f"as a false passer of {self.batch}, outvoted by "
            f"{accusers}",
            ConvictionKind.PROVEN: f"on proof about {self.batch} from {accusers}",
        }[self.kind]
        return (
            f"{short_id(self.trainer)} convicted at step {self.step} (epoch {self.epoch}) "
            f"{what} (agreement {self.agreement_milli / 1000:.3f})"
        )

    @property
    def proven(self) -> bool:
        return self.kind == ConvictionKind.PROVEN

    def to_wire(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "step": self.step,
            "trainer": self.trainer,
            "batch": self.batch.to_wire(),
            "verifiers": list(self.verifiers),
            "agreement_milli": self.agreement_milli,
            "kind": self.kind.value,
        }

    @classmethod
    def from_wire(cls, data: Any) -> Conviction:
        data = wire_map(data, "conviction")
        verifiers = wire_list(data, "verifiers", "conviction")
        kind = data.get("kind", ConvictionKind.VERIFIERS.value)  # absent before kinds existed
        try:
            conviction_kind = ConvictionKind(kind)
        except ValueError:
            raise ValueError(f"conviction.kind {kind!r:.40} is not a conviction kind") from None
        return cls(
            epoch=wire_uint(data, "epoch", "conviction"),
            step=wire_uint(data, "step", "conviction"),
            trainer=check_client_id(data.get("trainer"), "conviction.trainer"),
            batch=BatchId.from_wire(data.get("batch")),
            verifiers=tuple(check_client_id(v, "conviction.verifiers[]") for v in verifiers),
            agreement_milli=_agreement(data, "conviction"),
            kind=conviction_kind,
        )


def _tally_to_wire(tally: dict[bytes, set[bytes]]) -> dict[bytes, list[bytes]]:
    return {key: sorted(values) for key, values in sorted(tally.items())}


def _strikes_to_wire(strikes: Strikes) -> dict[bytes, dict[bytes, list[int]]]:
    return {
        trainer: {verifier: sorted(steps) for verifier, steps in sorted(by.items())}
        for trainer, by in sorted(strikes.items())
    }


def _strike_steps(values: Any, what: str) -> set[int]:
    if not isinstance(values, list) or len(values) > MAX_TALLIES:
        raise ValueError(f"{what} must be a list of at most {MAX_TALLIES} steps")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ValueError(f"{what} must hold non-negative integers")
    return set(values)


def _strikes_from_wire(data: dict[str, Any]) -> Strikes:
    """`strike_steps`, or a coordinator's from before the step rule: its `strikes` (trainer →
    accusers) as strikes at no known step, which count as accusers but as no step."""
    table = data.get("strike_steps")
    if table is None:
        old = _tally_from_wire(data.get("strikes"), "verification.strikes")
        return {trainer: {v: set() for v in accusers} for trainer, accusers in old.items()}
    what = "verification.strike_steps"
    table = wire_map(table, what)
    if len(table) > MAX_TALLIES:
        raise ValueError(f"{what} holds more than {MAX_TALLIES} entries")
    strikes: Strikes = {}
    for trainer, by in table.items():
        by = wire_map(by, f"{what}[]")
        if len(by) > MAX_TALLIES:
            raise ValueError(f"{what}[] names more than {MAX_TALLIES} verifiers")
        strikes[check_client_id(trainer, f"{what} key")] = {
            check_client_id(v, f"{what}[] key"): _strike_steps(steps, f"{what}[][]")
            for v, steps in by.items()
        }
    return strikes


def _refused_from_wire(data: Any) -> dict[int, set[bytes]]:
    """`refused` as step → trainers; absent (coordinators from before refusals): none."""
    if data is None:
        return {}
    what = "verification.refused"
    if not isinstance(data, list) or len(data) > REFUSED_STEPS:
        raise ValueError(f"{what} must be a list of at most {REFUSED_STEPS} steps")
    refused: dict[int, set[bytes]] = {}
    for entry in data:
        entry = wire_map(entry, f"{what}[]")
        trainers = wire_list(entry, "trainers", f"{what}[]")
        if len(trainers) > MAX_TALLIES:
            raise ValueError(f"{what}[].trainers names more than {MAX_TALLIES} trainers")
        refused[wire_uint(entry, "step", f"{what}[]")] = {
            check_client_id(t, f"{what}[].trainers[]") for t in trainers
        }
    return refused


def _tally_from_wire(data: Any, what: str) -> dict[bytes, set[bytes]]:
    if data is None:  # coordinators from before the tallies existed
        return {}
    table = wire_map(data, what)
    if len(table) > MAX_TALLIES:
        raise ValueError(f"{what} holds more than {MAX_TALLIES} entries")
    tally: dict[bytes, set[bytes]] = {}
    for key, values in table.items():
        if not isinstance(values, list) or len(values) > MAX_TALLIES:
            raise ValueError(f"{what}[] must be a list of at most {MAX_TALLIES} ids")
        tally[check_client_id(key, f"{what} key")] = {
            check_client_id(v, f"{what}[]") for v in values
        }
    return tally


@dataclass
class VerificationRecord:
    accusations: list[Accusation] = field(default_factory=list)
    attestations: list[Attestation] = field(default_factory=list)
    """Pending reports of the steps still open to them (pruned at each round start)."""
    convictions: list[Conviction] = field(default_factory=list)
    """The current epoch's convictions (those of earlier epochs are dropped when one starts:
    `new_epoch`); broadcast, saved."""
    bans: dict[bytes, Conviction] = field(default_factory=dict)
    """Key → the proven conviction that bans it from every later epoch (its first), in the
    order banned, at most `MAX_BANS`; saved and checked at admission, not broadcast (clients
    need only the current epoch's `convictions`)."""
    strikes: Strikes = field(default_factory=dict)
    """This epoch: trainer → the verifiers whose accusation of it stood → at which steps."""
    confirmed: dict[bytes, set[bytes]] = field(default_factory=dict)
    """This epoch: trainer → the verifiers with a *checkable* standing accusation of it: one
    that another verifier's accusation of the same check confirmed, or made in a step whose
    round elected no other verifier (`accusations.judge_closed_step`). Only their strikes
    convict: an accusation of a batch nobody else checked, in a step others checked other
    batches, is a liar's free move."""
    refuted_by: dict[bytes, set[bytes]] = field(default_factory=dict)
    """This epoch: verifier → the verifiers that outvoted it (passed a result it accused, or
    accused a result it passed, and were more)."""
    outvoted_about: dict[bytes, set[bytes]] = field(default_factory=dict)
    """This epoch: verifier → the trainers whose results it was outvoted on (`refuted_by`);
    the server's own count, neither broadcast nor saved."""
    refused: dict[int, set[bytes]] = field(default_factory=dict)
    """This epoch: step → the trainers whose results of that step no client applies although
    they are not convicted: their accusations stood when the step was judged and, counting
    those, verifiers of `MIN_ACCUSERS` different keys have checkable standing accusations of
    them this epoch (`accusations.judge_closed_step`). The newest `REFUSED_STEPS` steps are
    kept; broadcast, not saved."""
    committee_sizes: dict[int, int] = field(default_factory=dict)
    """Open steps: step → how many verifiers its round elected (taken when its reports are
    checked), so a step counts as having one verifier only when one was elected, not when
    only one reported; the server's own count, neither broadcast nor saved."""
    false_reports: dict[bytes, int] = field(default_factory=dict)
    """This epoch: member → weight of its witness reports proven false (`misconduct`); the
    server's own count, neither broadcast nor saved."""

    def new_epoch(self, epoch: int | None = None) -> None:
        """Forget the pending reports and the tallies; with `epoch` (the number of the epoch
        that starts), also the convictions of earlier epochs (the bans stay)."""
        if epoch is not None:
            self.convictions = [c for c in self.convictions if c.epoch >= epoch]
        self.accusations = []
        self.attestations = []
        self.strikes = {}
        self.confirmed = {}
        self.refuted_by = {}
        self.outvoted_about = {}
        self.refused = {}
        self.committee_sizes = {}
        self.false_reports = {}

    def reports(self) -> Iterable[Accusation | Attestation]:
        yield from self.accusations
        yield from self.attestations

    def excluded(self, trainer: bytes, epoch: int, step: int) -> bool:
        """Whether results of `trainer` trained at `step` of `epoch` must not be applied."""
        return any(
            c.trainer == trainer and c.epoch == epoch and c.step <= step for c in self.convictions
        )

    def refused_at(self, trainer: bytes, step: int) -> bool:
        """Whether the results of `trainer` trained at `step` of the current epoch are refused
        (`refused`) although it is not convicted."""
        return trainer in self.refused.get(step, ())

    def refuse(self, trainer: bytes, step: int) -> None:
        """Refuse the results of `trainer` at `step` (keeping the newest `REFUSED_STEPS` steps
        and at most `MAX_TALLIES` trainers a step)."""
        trainers = self.refused.setdefault(step, set())
        if len(trainers) < MAX_TALLIES:
            trainers.add(trainer)
        for old in sorted(self.refused)[:-REFUSED_STEPS]:
            del self.refused[old]

    def banned(self, client_id: bytes, epoch: int) -> bool:
        """Whether `client_id` may not join epoch `epoch`: a proven conviction (any epoch) or
        any conviction of that very epoch (a restart mid-epoch continues its number)."""
        return client_id in self.bans or any(
            c.trainer == client_id and (c.proven or c.epoch == epoch) for c in self.convictions
        )

    def ban(self, conviction: Conviction) -> bool:
        """Keep the proven `conviction` as a ban of its key for every later epoch; False when
        `MAX_BANS` keys are banned already (nothing is evicted, so no ban is ever lifted: this
        one then holds for its epoch only). A key already banned keeps its first ban."""
        if conviction.trainer in self.bans:
            return True
        if len(self.bans) >= MAX_BANS:
            return False
        self.bans[conviction.trainer] = conviction
        return True

    def convicted(self, trainer: bytes, epoch: int) -> Conviction | None:
        for conviction in self.convictions:
            if conviction.trainer == trainer and conviction.epoch == epoch:
                return conviction
        return None

    def to_wire(self) -> dict[str, Any]:
        return {
            "accusations": [a.to_wire() for a in self.accusations],
            "attestations": [a.to_wire() for a in self.attestations],
            "convictions": [c.to_wire() for c in self.convictions],
            "strikes": _tally_to_wire({t: set(by) for t, by in self.strikes.items()}),
            "strike_steps": _strikes_to_wire(self.strikes),
            "confirmed": _tally_to_wire(self.confirmed),
            "refuted_by": _tally_to_wire(self.refuted_by),
            "refused": [
                {"step": step, "trainers": sorted(trainers)}
                for step, trainers in sorted(self.refused.items())
            ],
        }

    @classmethod
    def from_wire(cls, data: Any) -> VerificationRecord:
        if data is None:  # coordinators from before verification existed
            return cls()
        data = wire_map(data, "verification")
        accusations = wire_list(data, "accusations", "verification")
        attestations = data.get("attestations", [])  # absent before attestations existed
        if not isinstance(attestations, list):
            raise ValueError("verification.attestations must be a list")
        convictions = wire_list(data, "convictions", "verification")
        if (
            len(accusations) + len(attestations) > MAX_ACCUSATIONS
            or len(convictions) > MAX_CONVICTIONS
        ):
            raise ValueError("verification holds too many reports or convictions")
        return cls(
            accusations=[Accusation.from_wire(a) for a in accusations],
            attestations=[Attestation.from_wire(a) for a in attestations],
            convictions=[Conviction.from_wire(c) for c in convictions],
            strikes=_strikes_from_wire(data),
            confirmed=_tally_from_wire(data.get("confirmed"), "verification.confirmed"),
            refuted_by=_tally_from_wire(data.get("refuted_by"), "verification.refuted_by"),
            refused=_refused_from_wire(data.get("refused")),
        )

    def to_toml(self) -> dict[str, Any]:
        """The state.toml table: ids as hex strings. Pending reports and the epoch's tallies
        are not saved (a restarted server starts the epoch again: its members must be
        accused anew)."""
        table: dict[str, Any] = {"convictions": [_conviction_toml(c) for c in self.convictions]}
        if self.bans:
            table["bans"] = [_conviction_toml(c) for c in self.bans.values()]
        return table

    @classmethod
    def from_toml(cls, table: Any) -> VerificationRecord:
        if table is None:
            return cls()
        try:
            table = wire_map(table, "verification")
            convictions = [
                _conviction_from_toml(entry)
                for entry in wire_list(table, "convictions", "verification")
            ]
            bans = table.get("bans", [])  # absent before bans were kept apart
            if not isinstance(bans, list) or len(bans) > MAX_BANS:
                raise ValueError(f"verification.bans must be a list of at most {MAX_BANS}")
            record = cls.from_wire({"accusations": [], "convictions": convictions})
            # files from before `bans`: the proven convictions among `convictions` are bans
            for conviction in [*map(_ban_from_toml, bans), *record.convictions]:
                if conviction.proven:
                    record.ban(conviction)
            return record
        except (ValueError, TypeError) as exc:
            raise ValueError(f"state file verification is not valid: {exc}") from exc


def _conviction_toml(conviction: Conviction) -> dict[str, Any]:
    entry = conviction.to_wire()
    entry["trainer"] = conviction.trainer.hex()
    entry["verifiers"] = [v.hex() for v in conviction.verifiers]
    return entry


def _conviction_from_toml(entry: Any) -> dict[str, Any]:
    """A saved conviction in its wire form (ids as bytes); files before `kind`: "verifiers"."""
    wire: dict[str, Any] = {**wire_map(entry, "conviction")}
    wire["trainer"] = bytes.fromhex(str(wire.get("trainer", "")))
    wire["verifiers"] = [bytes.fromhex(str(v)) for v in wire.get("verifiers", [])]
    return wire


def _ban_from_toml(entry: Any) -> Conviction:
    conviction = Conviction.from_wire(_conviction_from_toml(entry))
    if not conviction.proven:
        raise ValueError(f"verification.bans holds a {conviction.kind.value!r} conviction")
    return conviction
