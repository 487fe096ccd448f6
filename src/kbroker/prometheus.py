"""The Prometheus ``/metrics`` HTTP endpoint shared by the broker and ``kbroker mirror``:
one collector served on ``host:port`` (0 = any free port) by prometheus_client's server."""
from __future__ import annotations

import logging
import threading

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import start_http_server

log = logging.getLogger(__name__)


class MetricsServer:
    """The HTTP server serving ``/metrics``; ``port`` is the bound port."""

    def __init__(self, httpd, thread: threading.Thread, host: str):
        self._httpd = httpd
        self._thread = thread
        self.host = host
        self.port = httpd.server_port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def shutdown(self) -> None:
        """Stop serving and close the socket; idempotent."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        self._thread.join(5)


def serve(collector, host: str, port: int, thread_name: str) -> MetricsServer:
    """Serve ``collector`` alone at ``http://host:port/metrics``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    httpd, thread = start_http_server(port, addr=host, registry=registry)
    thread.name = thread_name
    server = MetricsServer(httpd, thread, host)
    log.info("metrics endpoint listening on %s", server.url)
    return server
