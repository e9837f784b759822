"""Late-joiner model download over P2P (reference §2.12), torch-free.

1. Ask every candidate peer for its `ModelManifest` concurrently (each request bounded by
   `manifest_timeout`). Peers that do not answer, hold no model, send a malformed manifest
   (its config not a JSON object, too long, ...) or one whose parameters add up to more than
   `max_model_size` do not vote.
2. Trust a manifest only when several peers vouch for it (`choose_manifest`): the peers that
   answered are grouped by what a joiner would load (`ModelManifest.content_digest`:
   parameters, config and tokenizer, not the step and epoch labels, so honest peers that
   shared the same weights at different steps agree), and a group is trusted when it holds a
   strict majority of the answers and of the peers that hold the weights but share none yet
   (`NotShared`; for a snapshot, also a peer sharing another step), *and* at least
   `MANIFEST_QUORUM` peers (all of them when fewer were asked: with one other member, its
   manifest is all there is). So two colluders cannot win the vote in the moments before the
   honest members share: those are undecided votes, not absent ones. In a permissioned
   run both count voters, not peers: a listed key with its delegates is one vote
   (`P2PNode.authorizers`, from the state broadcast; `psyche_common.votes`). While no group
   is trusted (peers disagree, too few answered, or they share no model yet: members share
   their weights at a Cooldown, and after a server restart mid-epoch only once their Warmup
   weights check has run, which also brings honest peers at different steps back to one
   model), every peer is asked again every `POLL_INTERVAL` seconds for up to `wait` seconds
   (a joiner waits `JOINER_WAIT`); then `ModelShareError`. When no peer answered at all and
   none said it shares no model yet (all unreachable), it fails at once.
3. Fetch every parameter from the peers that vouched for that manifest, at most
   `max_concurrent_parameter_requests` at once, spreading requests over peers. Each
   parameter's bytes must hash to the manifest's SHA-256; a corrupt peer is dropped for the
   rest of the download, a peer with `max_errors_per_peer` consecutive errors too, and the
   parameter is retried from the next peer.

So one lying member can neither crash a joiner (its manifest is checked before it votes) nor
give it wrong weights (it needs a majority of the answers and a second voucher). The reference
verifies nothing beyond blob content addressing (§2.12 "Verification"); the vouched-for
manifest is our addition (docs/deviations.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, NamedTuple

from psyche_common.protocol import short_id
from psyche_common.retry import call, polling
from psyche_common.votes import voter_of, voter_weights

from .fetch import TRANSIENT_ERRORS, FetchError, PeerHealth, fetch_verified
from .manifest import ManifestError, ModelManifest, ParameterInfo
from .transfer import NotHeld, NotShared, Received

if TYPE_CHECKING:
    from .node import P2PNode

log = logging.getLogger(__name__)

POLL_INTERVAL = 1.0
"""Seconds between manifest polls while no manifest is trusted."""
SNAPSHOT_POLL_INTERVAL = 0.2
"""Seconds between the polls of a mid-epoch joiner waiting for the members' snapshot: they
share it within moments of the round start, and every round it waits is a round later
seated (a few small requests to each member a second, for at most `JOINER_WAIT`)."""
JOINER_WAIT = 20.0
"""How long a joiner polls for a trusted manifest."""
MANIFEST_QUORUM = 2
"""Peers that must vouch for a manifest (when at least that many were asked)."""


class ModelShareError(Exception):
    """The model could not be downloaded from peers (the message says why)."""


@dataclass
class ManifestVote:
    """The manifest poll: the trusted manifest, who agreed, and what every other peer said."""

    manifest: ModelManifest
    holders: list[bytes]
    responders: int
    problems: dict[bytes, str] = field(default_factory=dict)


@dataclass
class ModelDownload:
    """A finished model download: the agreed manifest, the parameters and who served what."""

    manifest: ModelManifest
    parameters: dict[str, bytes]
    sources: dict[str, bytes]
    """Parameter name → id of the peer that served it."""
    corrupt_peers: set[bytes]
    holders: list[bytes]


async def request_manifest(node: P2PNode, peer_id: bytes) -> ModelManifest:
    received = await node.request_stream(
        peer_id, {"type": "GetManifest"}, max_size=node.config.max_manifest_size
    )
    return ModelManifest.decode(received.data)


def choose_manifest(
    answers: dict[bytes, ModelManifest],
    asked: int,
    authorizers: Mapping[bytes, bytes] | None = None,
    undecided: Iterable[bytes] = (),
) -> tuple[list[bytes], str | None]:
    """The peers vouching for the trusted manifest (see the module docstring), or ([], why
    none is trusted). `asked`: how many voters were asked (peers, in an open run);
    `undecided`: the peers that hold the weights but share none yet (they count in the
    majority's denominator). With `authorizers` (a permissioned run's delegates → their
    listed key), a majority and the quorum count voters: a listed key with its delegates is
    one vote (`psyche_common.votes`)."""
    if not answers:
        return [], "no peer answered with a model manifest"
    authorizers = authorizers or {}
    waiting = [peer for peer in dict.fromkeys(undecided) if peer not in answers]
    weights, voters = voter_weights([*answers, *waiting], authorizers)
    groups: dict[bytes, list[bytes]] = {}
    for peer_id, manifest in answers.items():
        groups.setdefault(manifest.content_digest(), []).append(peer_id)

    def votes(group: list[bytes]) -> Fraction:
        return sum((weights[peer] for peer in group), Fraction(0))

    holders = max(groups.values(), key=votes)
    if 2 * votes(holders) <= voters:
        counts = sorted((len(g) for g in groups.values()), reverse=True)
        pending = f", {len(waiting)} hold the weights but share none yet" if waiting else ""
        return [], (
            f"no manifest has a majority: {len(answers)} peers answered with "
            f"{len(groups)} different manifests ({counts}){pending}"
        )
    quorum = min(MANIFEST_QUORUM, asked)
    if len({voter_of(authorizers, peer) for peer in holders}) < quorum:
        return [], (
            f"only {len(holders)} of {asked} peers vouch for a manifest ({quorum} must: "
            "the others did not answer or share no model yet)"
        )
    return holders, None


async def poll_manifests(
    node: P2PNode,
    peer_ids: Iterable[bytes],
    *,
    wait: float = 0.0,
    step: int | None = None,
    interval: float = POLL_INTERVAL,
) -> ManifestVote:
    """Ask every peer for its manifest and return the one several of them vouch for
    (`choose_manifest`); while none is trusted, ask again every `POLL_INTERVAL` seconds for up
    to `wait` seconds (every `interval` seconds). `step`: only manifests labelled with that step count (a mid-epoch
    joiner's snapshot; a peer sharing another step shares none yet). Raises
    `ModelShareError` naming what each peer answered."""
    peers = [p for p in dict.fromkeys(peer_ids) if p != node.peer_id]

    async def ask() -> _Poll:
        answers, problems, not_shared, undecided = await _ask_manifests(node, peers, step)
        asked = len({voter_of(node.authorizers, peer) for peer in peers})
        holders, why = choose_manifest(answers, asked, node.authorizers, undecided)
        hopeless = not answers and not not_shared  # every peer unreachable
        return _Poll(answers, problems, holders, why, hopeless)

    answers, problems, holders, why, _ = await call(
        polling(lambda poll: poll.why is None or poll.hopeless, interval, wait), ask
    )
    if why is not None:
        raise ModelShareError(
            f"{why}; peers were unreachable for P2P parameter requests or disagree, try "
            f"joining again ({_describe(problems)})"
        )
    for peer_id in answers:
        if peer_id not in holders:
            problems[peer_id] = "manifest disagrees with the majority"
    manifest = answers[holders[0]]
    return ManifestVote(manifest, holders, len(answers), problems)


class _Poll(NamedTuple):
    """One manifest poll: the answers, the problems by peer, who vouches for the trusted
    manifest (or why none is trusted), and whether every peer was unreachable."""

    answers: dict[bytes, ModelManifest]
    problems: dict[bytes, str]
    holders: list[bytes]
    why: str | None
    hopeless: bool


async def _ask_manifests(
    node: P2PNode, peers: list[bytes], step: int | None = None
) -> tuple[dict[bytes, ModelManifest], dict[bytes, str], set[bytes], set[bytes]]:
    """Every peer's manifest, concurrently: (answers, problems by peer, the peers that share
    no model, or with `step` none of that step, and of those the undecided: they hold the
    weights and will share them). A manifest over `max_model_size` is a problem, not an
    answer."""
    answers: dict[bytes, ModelManifest] = {}
    problems: dict[bytes, str] = {}
    not_shared: set[bytes] = set()
    undecided: set[bytes] = set()
    limit = node.config.max_model_size

    async def ask(peer_id: bytes) -> None:
        try:
            async with asyncio.timeout(node.config.manifest_timeout):
                manifest = await request_manifest(node, peer_id)
        except TimeoutError:
            problems[peer_id] = f"no manifest within {node.config.manifest_timeout}s"
        except NotHeld as exc:
            problems[peer_id] = str(exc)
            not_shared.add(peer_id)
            if isinstance(exc, NotShared):
                undecided.add(peer_id)
        except ManifestError as exc:
            problems[peer_id] = f"malformed manifest: {exc}"
        except TRANSIENT_ERRORS as exc:
            problems[peer_id] = f"{type(exc).__name__}: {exc}"
        else:
            if step is not None and manifest.step != step:
                problems[peer_id] = f"shares the model of step {manifest.step}, not {step}"
                not_shared.add(peer_id)
                undecided.add(peer_id)  # a member: it shares the snapshot at the round start
            elif manifest.total_bytes > limit:
                problems[peer_id] = (
                    f"manifest of a {manifest.total_bytes}-byte model (max_model_size {limit})"
                )
            else:
                answers[peer_id] = manifest

    async with asyncio.TaskGroup() as group:
        for peer_id in peers:
            group.create_task(ask(peer_id))
    return answers, problems, not_shared, undecided


async def download_model(
    node: P2PNode,
    peer_ids: Iterable[bytes],
    *,
    on_parameter: Callable[[ParameterInfo, bytes], None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    vote: ManifestVote | None = None,
    wait: float = 0.0,
) -> ModelDownload:
    """Poll manifests (unless the caller already did: `vote`), then fetch every parameter,
    hash-checked, from several peers at once.

    `on_parameter(info, data)` is called as each parameter arrives (the app may load it right
    away); `on_progress(done, total)` after each; `wait` is the poll's (see
    `poll_manifests`). Raises `ModelShareError`."""
    if vote is None:
        vote = await poll_manifests(node, peer_ids, wait=wait)
    manifest = vote.manifest
    if vote.problems:
        log.info("manifest poll: %s", _describe(vote.problems))
    health = PeerHealth(max_errors=node.config.max_errors_per_peer)
    parameters: dict[str, bytes] = {}
    sources: dict[str, bytes] = {}

    def corrupt(peer_id: bytes, expected: bytes) -> None:
        health.record_corrupt(peer_id)
        node.report_corrupt(peer_id, expected)

    async def fetch_one(index: int, info: ParameterInfo) -> None:
        request = {"type": "GetParameter", "name": info.name}

        async def attempt(peer_id: bytes) -> Received:
            return await node.request_stream(
                peer_id, request, max_size=node.config.max_blob_size, expected_size=info.size
            )

        async with node.parameter_slots:
            data, peer_id = await fetch_verified(
                attempt,
                info.sha256,
                vote.holders,
                what=f"parameter {info.name!r}",
                health=health,
                deadline=node.config.fetch_deadline,
                rounds=node.config.parameter_rounds,
                backoff=node.config.retry_backoff,
                rotate=index,
                prefer_fast=False,
                on_corrupt=corrupt,
            )
        parameters[info.name] = data
        sources[info.name] = peer_id
        if on_parameter is not None:
            on_parameter(info, data)
        if on_progress is not None:
            on_progress(len(parameters), len(manifest.parameters))

    try:
        async with asyncio.TaskGroup() as group:
            for index, info in enumerate(manifest.parameters):
                group.create_task(fetch_one(index, info))
    except* FetchError as errors:
        first = errors.exceptions[0]
        raise ModelShareError(
            f"peers were unreachable for P2P parameter requests, try joining again: {first}"
        ) from first
    return ModelDownload(manifest, parameters, sources, set(health.corrupt), vote.holders)


def _describe(problems: dict[bytes, str]) -> str:
    return "; ".join(f"{short_id(p)}: {reason}" for p, reason in problems.items()) or "no peers"
