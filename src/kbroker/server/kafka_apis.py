"""KafkaApis: decode a request, route it to its API family's handler, answer errors.

Kafka: ``core/.../server/KafkaApis.scala`` (dispatch) and
``RequestHandlerHelper.handleError``. Handlers live one family per module in
``kbroker/server/apis/``; this module only routes. Rules at the boundary
(STYLE §5): a request whose header or body cannot be parsed closes its
connection (Kafka's processChannelException); ApiVersions at a version we do not
know is answered as v0 with UNSUPPORTED_VERSION and our ranges; any other
unsupported (api key, version) is answered with UNSUPPORTED_VERSION when the
response can be encoded at that version, and otherwise closes the connection
after logging why; an exception inside a handler answers UNKNOWN_SERVER_ERROR
where the response has a top-level error code, else closes the connection.
"""
from __future__ import annotations

import importlib
import logging
import time

from kbroker.protocol import (
    API_INFO, ApiKey, ErrorCode, ProtocolDecodeError, parse_request_header,
)
from kbroker.network.channel import RAW_SASL_TOKEN
from kbroker.server.apis import ApiHandler
from kbroker.server.request_context import RequestContext, error_response

log = logging.getLogger(__name__)

#: handler modules, one per API family; every one is required (none is optional: a
#: module that fails to import stops the broker's start-up, it is never left out)
HANDLER_MODULES = (
    "api_versions", "metadata", "produce", "fetch", "list_offsets", "topics",
    "offset_for_leader_epoch", "configs", "cluster", "delete_records", "group", "producer_id", "transaction",
    "write_txn_markers", "sasl", "scram_credentials", "client_quotas", "acls",
)


def collect_handlers() -> dict[int, ApiHandler]:
    """{api key: handler} from every module of HANDLER_MODULES; an ImportError propagates."""
    handlers: dict[int, ApiHandler] = {}
    for name in HANDLER_MODULES:
        mod = importlib.import_module(f"kbroker.server.apis.{name}")
        for key, h in mod.HANDLERS.items():
            if key in handlers:
                raise RuntimeError(f"two handlers for api key {key}")
            info = API_INFO[key]
            if h.min_version < info.min_version or h.max_version > info.max_version:
                raise RuntimeError(f"handler for {info.name} claims versions outside the spec")
            handlers[int(key)] = h
    return handlers


class KafkaApis:
    """Routes one listener family's requests to ``handlers`` ({api key: ApiHandler};
    default: every broker API family). ``broker`` is what handlers receive first."""

    def __init__(self, broker, channel, handlers: dict[int, ApiHandler] | None = None):
        self.broker = broker
        self.channel = channel
        self.handlers = collect_handlers() if handlers is None else dict(handlers)

    def supported_versions(self) -> dict[int, tuple[int, int]]:
        return {k: (h.min_version, h.max_version) for k, h in sorted(self.handlers.items())}

    def handle(self, request) -> None:
        """Called on a request-handler thread for every request frame."""
        if request.api_key == RAW_SASL_TOKEN:
            from kbroker.server.apis.sasl import handle_raw_token

            handle_raw_token(self.broker, self.channel, request)
            return
        try:
            header, pos = parse_request_header(request.payload)
        except ProtocolDecodeError as e:
            log.info("closing connection %s: cannot parse request header (api_key=%s, version=%s): %s",
                     request.connection_id, request.api_key, request.api_version, e)
            self.channel.close_connection(request)
            return
        q = getattr(self.broker, "quotas", None)
        ctx = RequestContext(request, header, self.channel,
                             quotas=q if q is not None and q.any_enabled else None)
        key, version = ctx.api_key, ctx.api_version
        handler = self.handlers.get(key)
        if handler is None or not handler.min_version <= version <= handler.max_version:
            self._unsupported(ctx, handler)
            return
        info = API_INFO[key]
        try:
            body, _ = info.request_class.decode_from(request.payload, pos, version)
        except ProtocolDecodeError as e:
            log.info("closing connection %s: cannot parse %s v%d request: %s",
                     request.connection_id, info.name, version, e)
            ctx.close_connection()
            return
        try:
            handler.handle(self.broker, ctx, body)
            if ctx.quotas is not None:
                ctx.handled_ns = time.monotonic_ns()
        except Exception:
            log.exception("error handling %s v%d from %s", info.name, version, request.connection_id)
            self._error_response(ctx, ErrorCode.UNKNOWN_SERVER_ERROR)

    def _unsupported(self, ctx: RequestContext, handler: ApiHandler | None) -> None:
        key, version = ctx.api_key, ctx.api_version
        if key == ApiKey.API_VERSIONS:
            from kbroker.server.apis.api_versions import api_versions_response

            # Kafka answers an unknown ApiVersions version as v0 (KIP-511)
            ctx.respond(api_versions_response(self, ErrorCode.UNSUPPORTED_VERSION), version=0)
            return
        info = API_INFO.get(key)
        if info is not None and info.is_version_supported(version):
            log.info("%s v%d from %s is not supported here; answering UNSUPPORTED_VERSION",
                     info.name, version, ctx.connection_id)
            if self._error_response(ctx, ErrorCode.UNSUPPORTED_VERSION, quiet=True):
                return
        log.info("closing connection %s: unsupported api key %d version %d", ctx.connection_id, key, version)
        ctx.close_connection()

    def _error_response(self, ctx: RequestContext, code: int, quiet: bool = False) -> bool:
        """Answer with ``code`` in the response's top-level error code, if the response
        has one at the request's version (encoding checks that); else close, unless quiet."""
        resp = error_response(ctx.api_key, ctx.api_version, code)
        if resp is None:
            if not quiet:
                log.info("closing connection %s: no error response for %s v%d (no top-level error code)",
                         ctx.connection_id, API_INFO[ctx.api_key].name, ctx.api_version)
                ctx.close_connection()
            return False
        ctx.respond(resp)
        return True
