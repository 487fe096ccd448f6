"""A response that cannot be encoded must not leave its connection muted for ever.

RequestContext.respond claims the request before encoding it; when encoding fails, Kafka's
RequestHandlerHelper.handleError answers the request's error response (UNKNOWN_SERVER_ERROR)
where it has a top-level error code, and the connection is closed where it has none. Real
network processors and handler threads (tests/test_network.py's running_server) dispatch to
KafkaApis, whose handlers are rigged to answer with bodies that do not encode, on the
handler thread and later from another thread (as a delayed operation would).
"""
from __future__ import annotations

import logging
import socket
import threading

import pytest

from kbroker.protocol import ApiKey, ErrorCode, decode_response, encode_request
from kbroker.protocol.messages import list_groups as lgr, metadata as md
from kbroker.server.apis import ApiHandler
from kbroker.server.kafka_apis import KafkaApis
from tests.test_network import assert_closed_by_server, connect, read_frame, running_server

pytestmark = pytest.mark.timeout(60)

LIST_GROUPS_V = 4
METADATA_V = 12


def _bad_list_groups():
    return lgr.ListGroupsResponse(groups=[lgr.ListedGroup(group_id=12345, protocol_type="consumer")])


def _bad_metadata():
    return md.MetadataResponse(throttle_time_ms=1 << 40, brokers=[], topics=[])


def _rigged(handlers):
    """KafkaApis on the server's channel with ``handlers`` {api key: fn(ctx, body)}."""
    state = {}
    lock = threading.Lock()

    def handle(channel, request):
        with lock:
            apis = state.get("apis")
            if apis is None:
                apis = state["apis"] = KafkaApis(None, channel)
                for key, fn in handlers.items():
                    apis.handlers[int(key)] = ApiHandler(0, 12, lambda b, ctx, body, fn=fn: fn(ctx, body))
        apis.handle(request)
    return handle


def _later(fn):
    t = threading.Timer(0.05, fn)
    t.daemon = True
    t.start()


HANDLERS = {
    # ListGroups has a top-level error code: the error response goes out instead
    ApiKey.LIST_GROUPS: lambda ctx, body: ctx.respond(
        _bad_list_groups() if ctx.client_id == "bad" else lgr.ListGroupsResponse(groups=[])),
    # Metadata has none: the connection is closed
    ApiKey.METADATA: lambda ctx, body: (ctx.respond(_bad_metadata()) if ctx.client_id == "now"
                                        else _later(lambda: ctx.respond(_bad_metadata()))),
}


def _call(sock, key, version, body, client_id, corr):
    sock.sendall(encode_request(key, version, corr, client_id, body))
    header, resp = decode_response(read_frame(sock), key, version)
    assert header.correlation_id == corr
    return resp


def test_unencodable_response_answers_the_error_response_or_closes(caplog):
    caplog.set_level(logging.ERROR, logger="kbroker.server.request_context")
    with running_server(_rigged(HANDLERS)) as server:
        port = server.bound_port()
        with connect(port) as other, connect(port) as s:
            # answered with UNKNOWN_SERVER_ERROR, and the connection goes on
            r = _call(s, ApiKey.LIST_GROUPS, LIST_GROUPS_V, lgr.ListGroupsRequest(), "bad", 1)
            assert (r.error_code, r.groups) == (ErrorCode.UNKNOWN_SERVER_ERROR, [])
            r = _call(s, ApiKey.LIST_GROUPS, LIST_GROUPS_V, lgr.ListGroupsRequest(), "good", 2)
            assert r.error_code == ErrorCode.NONE
            # no error response possible: closed, whether answered on the handler thread ...
            with connect(port) as m:
                m.sendall(encode_request(ApiKey.METADATA, METADATA_V, 3, "now", md.MetadataRequest(topics=[])))
                assert_closed_by_server(m)
            # ... or later from another thread
            with connect(port) as m:
                m.sendall(encode_request(ApiKey.METADATA, METADATA_V, 4, "later", md.MetadataRequest(topics=[])))
                assert_closed_by_server(m)
            # the other connections are unaffected
            for c, corr in ((other, 5), (s, 6)):
                assert _call(c, ApiKey.LIST_GROUPS, LIST_GROUPS_V, lgr.ListGroupsRequest(), "good",
                             corr).error_code == ErrorCode.NONE
    logged = [r.getMessage() for r in caplog.records if r.name == "kbroker.server.request_context"]
    assert any("ListGroups v4 response (api key 16" in m for m in logged), logged
    assert sum("Metadata v12 response (api key 3" in m for m in logged) == 2, logged


def test_assert_closed_helper_times_out_on_a_muted_connection():
    """The check above can fail: a connection that is never answered is not 'closed'."""
    with running_server(lambda channel, request: None) as server:
        with connect(server.bound_port()) as s:
            s.settimeout(0.5)
            s.sendall(encode_request(ApiKey.METADATA, METADATA_V, 1, "x", md.MetadataRequest(topics=[])))
            with pytest.raises(socket.timeout):
                assert_closed_by_server(s)
