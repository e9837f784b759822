"""`RunOutputs`: the client's local outputs besides its metrics sink, as the flags ask for
them: the event files (`--events-dir`, `events_recorder`) and the Prometheus port
(`--metrics-local-port`, `local_port`).

`RunOutputs.open(...)` starts them (blocking: run it off the event loop) and raises
`sink.MetricsStartError` naming the flag when one cannot start (a port in use, a directory that
cannot be written). The app then calls `observe(coordinator)` with each new coordinator state
(the event files' state changes, the port's figures) and hands `sink` to its step reporter (each
finished step's figures into the event files); `close()` stops both.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from psyche_common.coordinator import Coordinator
from psyche_common.events.files import EventFileError, EventFileWriter

from psyche_client.metrics.events_recorder import ClientEvents
from psyche_client.metrics.live_figures import live_figures
from psyche_client.metrics.local_port import LocalMetricsServer
from psyche_client.metrics.options import MetricsOptions
from psyche_client.metrics.sink import MetricsStartError
from psyche_client.p2p.stats import TransferStats
from psyche_client.round.stats import ClientStats
from psyche_client.session.server_link import CLIENT_VERSION

log = logging.getLogger("psyche.client")


@dataclass
class RunOutputs:
    stats: ClientStats
    traffic: TransferStats
    events: ClientEvents | None = None
    port: LocalMetricsServer | None = None

    @property
    def sink(self) -> ClientEvents | None:
        """Where the step reporter also sends each finished step (None: nowhere)."""
        return self.events

    @classmethod
    def open(
        cls,
        options: MetricsOptions,
        run_id: str,
        client_id: bytes,
        stats: ClientStats,
        traffic: TransferStats,
    ) -> RunOutputs:
        outputs = cls(stats, traffic)
        short = client_id[:4].hex()
        if options.local_port is not None:
            server = LocalMetricsServer(options.local_port, run_id, short)
            try:
                port = server.start()
            except OSError as exc:
                raise MetricsStartError(
                    f"--metrics-local-port {options.local_port}: cannot serve metrics on "
                    f"127.0.0.1:{options.local_port}: {exc}; choose another port (0: any free "
                    "one)"
                ) from exc
            outputs.port = server
            log.info(
                "metrics on http://127.0.0.1:%d/metrics",
                port,
                extra={"metrics_port": port},
            )
        if options.events_dir is not None:
            try:
                writer = EventFileWriter(
                    options.events_dir,
                    client_id.hex(),
                    {"run_id": run_id, "version": CLIENT_VERSION},
                    keep_files=options.keep_event_files,
                )
            except EventFileError as exc:
                outputs.close()
                raise MetricsStartError(f"--events-dir: {exc}") from exc
            outputs.events = ClientEvents(writer)
            log.info("recording events in %s", writer.directory)
        return outputs

    def observe(self, coordinator: Coordinator) -> None:
        if self.events is not None:
            self.events.observe(coordinator)
        if self.port is not None:
            self.port.publish(live_figures(self.stats, self.traffic))

    def close(self) -> None:
        if self.port is not None:
            self.port.close()
            self.port = None
        if self.events is not None:
            self.events.close()
            self.events = None
