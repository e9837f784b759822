"""Pure text of the server dashboard, computed from a `ServerApp` at one instant.

`build_view(app, now)` returns a `DashboardView` of plain strings/numbers so the widgets only
copy text, and tests can check the text without a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from psyche_common.coordinator import Coordinator
from psyche_common.coordinator.types import RunState
from psyche_common.protocol import short_id

from ..app import ServerApp
from ..relay import RelayServer
from ..run_metrics import RunMetrics


def run_state_text(coordinator: Coordinator, pending_count: int, now: int) -> str:
    """The run state as the reference's dashboard words it (with live countdowns)."""
    state = coordinator.run_state
    config = coordinator.config
    started = coordinator.run_state_start_unix_timestamp
    if state == RunState.WaitingForMembers:
        need = max(0, int(config.init_min_clients) - pending_count)
        return f"Waiting for {need} members"
    if state == RunState.Warmup:
        return f"Warmup ({max(0, started + int(config.warmup_time) - now)}s remaining)"
    if state == RunState.Cooldown:
        if int(config.cooldown_time) == 0:
            return "Cooldown"
        return f"Cooldown ({max(0, started + int(config.cooldown_time) - now)}s remaining)"
    return {
        RunState.Uninitialized: "Uninitialized",
        RunState.RoundTrain: "Training",
        RunState.RoundWitness: "Witnessing",
        RunState.Finished: "Finished",
        RunState.Paused: "Paused",
    }[state]


def pause_hint(coordinator: Coordinator) -> str:
    if coordinator.pending_pause:
        return "Pending pause..."
    if coordinator.run_state == RunState.Paused:
        return "Ctrl + P to resume"
    return "Ctrl + P to pause"


@dataclass
class DashboardView:
    """The text the dashboard shows, computed from the server without any widget."""

    address: str
    run_id: str
    pause_hint: str
    run_state: str
    next_round_clients: list[str]
    clients_line: str
    height: int
    step: int
    epoch: int
    checkpoint: str
    weights_line: str
    clients_this_round: list[str]
    exited_clients: list[str]
    config_lines: list[str]
    round_lines: list[str]
    data: DataView | None = None
    verification_line: str = ""
    relay_line: str = ""
    charts: ChartsView = field(default_factory=lambda: ChartsView((), ()))
    eval_lines: list[str] = field(default_factory=list)
    """One line per eval the witnesses report: its latest median and the step of it."""


@dataclass(frozen=True)
class ChartsView:
    """The Dashboard's charts: (step, median over the step's witnesses) of the loss and of
    one client's tokens/s, for the steps the server keeps (`run_metrics`)."""

    losses: tuple[tuple[int, float], ...]
    tokens_per_sec: tuple[tuple[int, float], ...]


def charts_view(metrics: RunMetrics) -> ChartsView:
    steps = metrics.steps()
    return ChartsView(
        losses=tuple((s.step, s.loss) for s in steps if s.loss is not None),
        tokens_per_sec=tuple(
            (s.step, s.tokens_per_sec) for s in steps if s.tokens_per_sec is not None
        ),
    )


def eval_lines(metrics: RunMetrics) -> list[str]:
    """`name: value (step N)` for every eval name the witnesses reported (`run_metrics`)."""
    return [
        f"{name}: {value:.4f} (step {step})"
        for name, (step, value) in metrics.latest_evals().items()
    ]


@dataclass
class DataView:
    """The Data server tab: samples served so far out of the data's total, per client."""

    total_samples: int
    provided_samples: int
    per_client: list[str] = field(default_factory=list)
    clients_served: int = 0
    height: int = 0

    @property
    def fraction_given_out(self) -> float:
        return self.provided_samples / self.total_samples if self.total_samples else 0.0


def _weights_line(app: ServerApp) -> str:
    verdict = app.weights.latest()
    if verdict is None:
        return "Weights: no reports yet"
    if verdict.majority is None and verdict.reports > 1:
        return f"Weights @ step {verdict.step}: no majority among {verdict.reports} reports"
    if verdict.divergent:
        ids = ", ".join(sorted(short_id(c) for c in verdict.divergent))
        return f"Weights @ step {verdict.step}: DIVERGENT {ids} ({verdict.reports} reports)"
    return f"Weights @ step {verdict.step}: {verdict.reports} report(s) agree"


def joiners_text(coordinator: Coordinator) -> str:
    """The mid-epoch joiners and where each is: fetching the model, or in sync and waiting
    for its seat at the next round start ("" without joiners)."""
    joining = coordinator.epoch_state.joining
    if not joining:
        return ""
    states = ", ".join(
        f"{short_id(j.id)} {'in sync, seated next round' if j.ready else 'fetching the model'}"
        for j in joining
    )
    return f"; joining: {states}"


def verification_line(coordinator: Coordinator) -> str:
    """`Verification: 25%, 1 conviction (last: 0a1b2c3d at step 7, agreement 0.02)`: the
    current epoch's convictions, then `, 3 keys banned` when some are banned on proof."""
    percent = coordinator.config.verification_percent
    convictions = coordinator.verification.convictions
    bans = len(coordinator.verification.bans)
    banned = "" if not bans else f", {bans} key{'' if bans == 1 else 's'} banned"
    if not convictions:
        return f"Verification: {percent}%, no conviction{banned}"
    last = convictions[-1]
    plural = "" if len(convictions) == 1 else "s"
    return (
        f"Verification: {percent}%, {len(convictions)} conviction{plural} (last: "
        f"{short_id(last.trainer)} at step {last.step}, agreement "
        f"{last.agreement_milli / 1000:.2f}){banned}"
    )


def relay_line(relay: RelayServer | None) -> str:
    """The relay's port, open pipes and bytes forwarded (or that there is none)."""
    if relay is None:
        return "Relay: off (--no-relay)"
    cap = relay.limits.max_mbps
    line = (
        f"Relay: port {relay.port}, {relay.open_pipes} pipe(s) open, "
        f"{_megabytes(relay.stats.forwarded)} forwarded"
    )
    return line + (f" (cap {cap:g} Mbit/s)" if cap else "")


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB"


def _relayed(relay: RelayServer | None, client_id: bytes) -> str:
    """The bytes a client sent and received through the relay ("" if none), e.g.
    ' (relayed 1.2 MB out, 3.4 MB in)'."""
    if relay is None:
        return ""
    sent, received = relay.stats.sent[client_id], relay.stats.received[client_id]
    if not sent and not received:
        return ""
    return f" (relayed {_megabytes(sent)} out, {_megabytes(received)} in)"


def build_view(app: ServerApp, now: int) -> DashboardView:
    coordinator = app.coordinator
    epoch_state = coordinator.epoch_state
    config = coordinator.config
    current = coordinator.current_round()
    divergent = app.weights.divergent_clients()
    outbound = set(app.reachability.unreachable(c.id for c in epoch_state.clients))
    clients_this_round = [
        f"{short_id(c.id)} {c.state.name}"
        + (" (P2P outbound only)" if c.id in outbound else "")
        + (" ⚠ weights differ" if c.id in divergent else "")
        + _relayed(app.relay, c.id)
        for c in epoch_state.clients
    ]
    config_lines = [
        f"Data source: {coordinator.model.data_location} ({coordinator.model.data_type.value})",
        f"Model checkpoint: {coordinator.model.checkpoint}",
        f"Clients: min {config.min_clients}, to start {config.init_min_clients}",
        f"Global batch: {config.global_batch_size_start} → {config.global_batch_size_end} "
        f"(warmup tokens {config.global_batch_size_warmup_tokens})",
        f"Times (s): warmup {config.warmup_time}, train ≤{config.max_round_train_time}, "
        f"witness {config.round_witness_time}, cooldown {config.cooldown_time}, "
        f"epoch {config.epoch_time}",
        f"Witness nodes: {config.witness_nodes}, total steps: {config.total_steps}",
    ]
    round_lines = []
    for offset in range(len(epoch_state.rounds)):
        slot = (epoch_state.rounds_head - offset) % len(epoch_state.rounds)
        r = epoch_state.rounds[slot]
        marker = "→" if offset == 0 else " "
        round_lines.append(
            f"{marker} slot {slot}: height {r.height}, clients {r.clients_len}, "
            f"witnesses {len(r.witnesses)}, data index {r.data_index}"
        )
    data = None
    if app.data_server is not None:
        server = app.data_server
        data = DataView(
            total_samples=server.total_samples,
            provided_samples=server.provided_samples,
            per_client=[f"[{cid.hex()}]: {n}" for cid, n in server.served.most_common()],
            clients_served=len(server.served),
            height=server.height,
        )
    return DashboardView(
        address=app.address,
        run_id=app.run_id,
        pause_hint=pause_hint(coordinator),
        run_state=run_state_text(coordinator, len(app.pending), now),
        next_round_clients=[short_id(cid) for cid in app.pending],
        clients_line=(
            f"Clients: {len(epoch_state.clients)} ({len(epoch_state.exited_clients)} exited)"
            + joiners_text(coordinator)
        ),
        height=int(current.height),
        step=coordinator.progress.step,
        epoch=coordinator.progress.epoch,
        checkpoint=str(coordinator.model.checkpoint),
        weights_line=_weights_line(app),
        clients_this_round=clients_this_round,
        exited_clients=[
            f"{short_id(c.id)} {c.state.name} at height {c.exited_height}"
            for c in epoch_state.exited_clients
        ],
        config_lines=config_lines,
        round_lines=round_lines,
        data=data,
        verification_line=verification_line(coordinator),
        relay_line=relay_line(app.relay),
        charts=charts_view(app.metrics),
        eval_lines=eval_lines(app.metrics),
    )
