"""Late-joiner model download over P2P (reference §2.12), torch-free.

1. Ask every candidate peer for its `ModelManifest` concurrently (each request bounded by
   `manifest_timeout`). Peers that do not answer, hold no model or send a malformed manifest
   do not vote.
   Peers that are reachable but share no model yet (members share their weights at a
   Cooldown, and after a server restart mid-epoch only once their Warmup weights check has
   run) are asked again every `NOT_SHARED_POLL` seconds for up to `not_shared_wait` seconds
   (a joiner waits `JOINER_NOT_SHARED_WAIT`).
2. Trust the manifest that a strict majority of the *responding* peers agree on (the same
   parameters, config and tokenizer: `ModelManifest.content_digest`; the step and epoch a
   peer labelled its share with do not count, since honest peers share the same weights at
   different moments: a Cooldown, a later Warmup check). No majority → `ModelShareError`. With a single responder its manifest
   is trusted: the check only protects when several honest peers answer.
3. Fetch every parameter from the peers that voted for that manifest, at most
   `max_concurrent_parameter_requests` at once, spreading requests over peers. Each
   parameter's bytes must hash to the manifest's SHA-256; a corrupt peer is dropped for the
   rest of the download, a peer with `max_errors_per_peer` consecutive errors too, and the
   parameter is retried from the next peer.

The reference verifies nothing beyond blob content addressing (§2.12 "Verification"); the
majority manifest is our addition (docs/deviations.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from psyche_common.protocol import short_id

from .fetch import TRANSIENT_ERRORS, FetchError, PeerHealth, fetch_verified
from .manifest import ManifestError, ModelManifest, ParameterInfo
from .transfer import NotHeld, Received

if TYPE_CHECKING:
    from .node import P2PNode

log = logging.getLogger(__name__)

NOT_SHARED_POLL = 1.0
JOINER_NOT_SHARED_WAIT = 20.0


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


async def poll_manifests(
    node: P2PNode, peer_ids: Iterable[bytes], *, not_shared_wait: float = 0.0
) -> ManifestVote:
    """Ask every peer for its manifest and return the one a strict majority agrees on. While
    no peer has answered with one but some answered that they share none yet, ask again every
    `NOT_SHARED_POLL` seconds for up to `not_shared_wait` seconds."""
    peers = [p for p in dict.fromkeys(peer_ids) if p != node.peer_id]
    deadline = asyncio.get_running_loop().time() + not_shared_wait
    while True:
        answers, problems, not_shared = await _ask_manifests(node, peers)
        if answers or not not_shared or asyncio.get_running_loop().time() >= deadline:
            break
        await asyncio.sleep(NOT_SHARED_POLL)
    if not answers:
        raise ModelShareError(
            "no peer answered with a model manifest; peers were unreachable for P2P parameter "
            f"requests, try joining again ({_describe(problems)})"
        )
    by_digest: dict[bytes, list[bytes]] = {}
    for peer_id, manifest in answers.items():
        by_digest.setdefault(manifest.content_digest(), []).append(peer_id)
    votes = Counter({digest: len(holders) for digest, holders in by_digest.items()})
    (best_digest, best_count), *_ = votes.most_common(1)
    if 2 * best_count <= len(answers):
        raise ModelShareError(
            f"no manifest has a majority: {len(answers)} peers answered with "
            f"{len(by_digest)} different manifests ({sorted(votes.values(), reverse=True)})"
        )
    holders = by_digest[best_digest]
    for peer_id in answers:
        if peer_id not in holders:
            problems[peer_id] = "manifest disagrees with the majority"
    manifest = answers[holders[0]]
    return ManifestVote(manifest, holders, len(answers), problems)


async def _ask_manifests(
    node: P2PNode, peers: list[bytes]
) -> tuple[dict[bytes, ModelManifest], dict[bytes, str], set[bytes]]:
    """Every peer's manifest, concurrently: (answers, problems by peer, the peers that share
    no model)."""
    answers: dict[bytes, ModelManifest] = {}
    problems: dict[bytes, str] = {}
    not_shared: set[bytes] = set()

    async def ask(peer_id: bytes) -> None:
        try:
            async with asyncio.timeout(node.config.manifest_timeout):
                answers[peer_id] = await request_manifest(node, peer_id)
        except TimeoutError:
            problems[peer_id] = f"no manifest within {node.config.manifest_timeout}s"
        except NotHeld as exc:
            problems[peer_id] = str(exc)
            not_shared.add(peer_id)
        except ManifestError as exc:
            problems[peer_id] = f"malformed manifest: {exc}"
        except TRANSIENT_ERRORS as exc:
            problems[peer_id] = f"{type(exc).__name__}: {exc}"

    async with asyncio.TaskGroup() as group:
        for peer_id in peers:
            group.create_task(ask(peer_id))
    return answers, problems, not_shared


async def download_model(
    node: P2PNode,
    peer_ids: Iterable[bytes],
    *,
    on_parameter: Callable[[ParameterInfo, bytes], None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    vote: ManifestVote | None = None,
    not_shared_wait: float = 0.0,
) -> ModelDownload:
    """Poll manifests (unless the caller already did: `vote`), then fetch every parameter,
    hash-checked, from several peers at once.

    `on_parameter(info, data)` is called as each parameter arrives (the app may load it right
    away); `on_progress(done, total)` after each; `not_shared_wait` is the poll's (see
    `poll_manifests`). Raises `ModelShareError`."""
    if vote is None:
        vote = await poll_manifests(node, peer_ids, not_shared_wait=not_shared_wait)
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
