"""The broker's network layer: moves opaque size-prefixed frames (see ``processor.py``).

Independent of the protocol codecs: it parses only the 8 header bytes every request
header version shares (api_key, api_version, correlation_id).
"""
from kbroker.network.channel import (
    REQUEST_HEADER_PREFIX_SIZE, SHUTDOWN, Request, RequestChannel, Response,
)
from kbroker.network.metrics import NetworkMetrics
from kbroker.network.socket_server import Listener, SocketServer, SocketServerConfig

__all__ = [
    "REQUEST_HEADER_PREFIX_SIZE", "SHUTDOWN", "Listener", "NetworkMetrics", "Request",
    "RequestChannel", "Response", "SocketServer", "SocketServerConfig",
]
