"""ControllerServer: the controller role's own listeners, request handlers and APIs.

Kafka: ``core/.../server/ControllerServer.scala`` and ``ControllerApis.scala``. A node
with ``process.roles`` containing ``controller`` serves the quorum RPCs (Vote,
BeginQuorumEpoch, EndQuorumEpoch, Fetch and FetchSnapshot of ``__cluster_metadata``,
DescribeQuorum, ...) and the controller RPCs (BrokerRegistration, BrokerHeartbeat,
CreateTopics, AlterPartition, ...) on the listeners named by
``controller.listener.names``, with a SocketServer and handler pool of its own, apart
from the broker role's client listeners. An API that is not enabled on a controller
listener closes the connection, as Kafka's SocketServer does for a request whose API the
listener's ApiVersionManager does not enable; ApiVersions lists exactly the handlers.

The handlers are given by the roles that own them (the raft manager, the quorum
controller): this module only binds, routes and stops.
"""
from __future__ import annotations

import logging

from kbroker.network.socket_server import SocketServer
from kbroker.protocol import API_INFO, ApiKey
from kbroker.server.apis import ApiHandler
from kbroker.server.kafka_apis import KafkaApis
from kbroker.server.request_context import RequestContext
from kbroker.server.request_handler import KafkaRequestHandlerPool

log = logging.getLogger(__name__)


class ControllerApis(KafkaApis):
    """KafkaApis for controller listeners: ApiVersions, SaslHandshake/SaslAuthenticate plus the
    given handlers; any other API closes the connection (not enabled on this listener)."""

    def __init__(self, target, channel, handlers: dict[int, ApiHandler]):
        from kbroker.server.apis.api_versions import HANDLERS as API_VERSIONS

        own = API_VERSIONS[ApiKey.API_VERSIONS]
        # ApiVersions answers for this listener's table, whatever ``target`` is
        api_versions = ApiHandler(own.min_version, own.max_version,
                                  lambda _target, ctx, req: own.handle(self, ctx, req))
        from kbroker.server.apis.sasl import HANDLERS as SASL
        # SaslHandshake / SaslAuthenticate for SASL controller listeners (the network
        # processor lets nothing else through before authentication)
        super().__init__(target, channel, {**SASL, **handlers, ApiKey.API_VERSIONS: api_versions})

    @property
    def apis(self) -> "ControllerApis":
        """What the shared ApiVersions handler reads the version table from."""
        return self

    def _unsupported(self, ctx: RequestContext, handler: ApiHandler | None) -> None:
        if handler is not None or ctx.api_key == ApiKey.API_VERSIONS:
            super()._unsupported(ctx, handler)
            return
        info = API_INFO.get(ctx.api_key)
        log.info("closing connection %s: %s v%d is not enabled on a controller listener",
                 ctx.connection_id, info.name if info else f"api key {ctx.api_key}", ctx.api_version)
        ctx.close_connection()


class ControllerServer:
    """Binds ``listeners`` (the controller listeners), answers with ``handlers``.

    ``target`` is what every handler receives as its first argument (the node's
    controller-side state). Start/stop from one controlling thread."""

    def __init__(self, config, listeners, handlers: dict[int, ApiHandler], target=None):
        c = config
        self.socket_server = SocketServer(c.socket_server_config(listeners, client_limits=False))
        self.apis = ControllerApis(target if target is not None else self, self.socket_server.channel, handlers)
        self.handler_pool = KafkaRequestHandlerPool(self.socket_server.channel, self.apis.handle,
                                                    c["num.io.threads"], self.socket_server.metrics)
        self._started = False

    def startup(self) -> None:
        self.handler_pool.start()
        self._started = True
        self.socket_server.start()

    def bound_port(self, listener_name: str | None = None) -> int:
        return self.socket_server.bound_port(listener_name)

    def shutdown(self) -> None:
        if not self._started:
            return
        self._started = False
        self.socket_server.stop()
        self.handler_pool.shutdown()
