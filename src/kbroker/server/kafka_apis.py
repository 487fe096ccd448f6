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
import struct
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


#: {api key * 65536 + version: (request header version, request body decode_from, ApiInfo)}
#: for every (api key, version) of the protocol table (so it stays bounded), filled on use
_ROUTES: dict = {}
_i16 = struct.Struct(">h").unpack_from
_struct_error = struct.error


def _route(key: int, version: int):
    """The ``_ROUTES`` entry of a known api key at a version of its spec, else None."""
    info = API_INFO.get(key)
    if info is None or not info.is_version_supported(version):
        return None
    route = _ROUTES[key * 65536 + version] = (
        info.request_header_version(version), info.request_class.decode_from, info)
    return route


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
        """Called on a request-handler thread for every request frame.

        The request header is read here in the usual case (header v1/v2 with a client
        id and no tagged fields; api key, version and correlation id were read by the
        network layer): see :func:`_route`. Anything else goes through
        ``parse_request_header``, which reports what is wrong."""
        key = request.api_key
        version = request.api_version
        route = _ROUTES.get(key * 65536 + version)
        if route is None:
            route = _route(key, version)
            if route is None:
                self._handle_slow(request)
                return
        hv, decode, info = route
        payload = request.payload
        try:
            if hv:
                n = _i16(payload, 8)[0]
                if n < 0:
                    client_id = ""               # null reads as "" (Kafka's quirk)
                    pos = 10
                else:
                    pos = 10 + n
                    if pos > len(payload):
                        raise IndexError
                    client_id = str(payload[10:pos], "utf-8", "replace")
                if hv == 2:
                    if payload[pos]:
                        raise IndexError         # tagged fields: the generated reader
                    pos += 1
            else:
                client_id = ""
                pos = 8
        except (IndexError, _struct_error):
            self._handle_slow(request)
            return
        q = getattr(self.broker, "quotas", None)
        ctx = RequestContext(request, None, self.channel, None,
                             q if q is not None and q.any_enabled else None, client_id)
        handler = self.handlers.get(key)
        if handler is None or not handler.min_version <= version <= handler.max_version:
            self._unsupported(ctx, handler)
            return
        self._dispatch(request, ctx, handler, info, decode, pos)

    def _handle_slow(self, request) -> None:
        """``handle`` for what its fast path does not read: a raw SASL token, an unknown
        api key or version, a header with tagged fields, a malformed header."""
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
        self._dispatch(request, ctx, handler, info, info.request_class.decode_from, pos)

    def _dispatch(self, request, ctx: RequestContext, handler: ApiHandler, info, decode, pos: int) -> None:
        """Decode the body at ``pos`` and call the handler (errors: see the module docstring)."""
        version = ctx.api_version
        try:
            body, _ = decode(request.payload, pos, version)
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
