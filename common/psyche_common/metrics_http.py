"""`MetricsHttpServer`: a prometheus-client registry served at `http://HOST:PORT/metrics` from
the library's own daemon thread; the server's `--metrics-port` and the client's
`--metrics-local-port` both use it."""

from __future__ import annotations

from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


class MetricsHttpServer:
    """`registry` on `host:port` (port 0: a free one, read back from `port`)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self._requested_port = port
        self._server: WSGIServer | None = None
        self._thread: Thread | None = None

    def start(self) -> int:
        """Bind and serve from a daemon thread; returns the port (OSError when it is taken)."""
        self._server, self._thread = start_http_server(
            self._requested_port, addr=self.host, registry=self.registry
        )
        return self.port

    @property
    def port(self) -> int:
        assert self._server is not None, "the metrics server is not started"
        return int(self._server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
