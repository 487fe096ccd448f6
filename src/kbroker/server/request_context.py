"""RequestContext: one decoded request and the way to answer it.

Created by :class:`~kbroker.server.kafka_apis.KafkaApis` on a handler thread.
A handler answers exactly once — now, or later from any thread (a delayed
operation completing in the purgatory) — with ``respond(body)``,
``respond_no_op()`` (produce with acks=0) or ``close_connection()``.
Later calls are ignored (Kafka's DelayedOperation completes once; so does a
request).

Client quotas (KIP-219): when the broker has quotas (``quotas``, kbroker.quota's
QuotaManagers) the request's handler time counts against ``request_percentage``, and
a produce or fetch handler may have set ``bandwidth_throttle_ms`` from the byte-rate
quotas; the larger throttle goes into the response's ``throttle_time_ms`` (where its
version has one) and the connection stays muted that long after the response.

A response that cannot be encoded is a broker bug, but must not leave the
connection muted for ever (the request is claimed before it is encoded):
``respond`` logs it with the api key and version and answers the request's
error response instead (UNKNOWN_SERVER_ERROR in the top-level error code, as
Kafka's RequestHandlerHelper.handleError), or, for a response without one,
closes the connection (the client sees a disconnect and retries).
"""
from __future__ import annotations

import logging
import threading
import time

from kbroker.protocol import API_INFO, ApiKey, ErrorCode, encode_response_parts
from kbroker.protocol.headers import RequestHeader

log = logging.getLogger(__name__)

#: Guards every context's ``_answered`` flag: held for two bytecodes, so one lock for all
#: contexts costs nothing in contention and saves allocating a lock per request.
_CLAIM_LOCK = threading.Lock()


class RequestContext:
    __slots__ = ("request", "_header", "api_key", "api_version", "correlation_id", "client_id",
                 "channel", "_answered", "on_response", "quotas", "bandwidth_throttle_ms",
                 "handled_ns", "quota_exempt", "authz")

    def __init__(self, request, header: RequestHeader | None, channel, on_response=None, quotas=None,
                 client_id: str = ""):
        """``header`` None: api key, version and correlation id are the request's own
        (``Request`` reads them from the frame), the client id is ``client_id``; the
        ``header`` property then makes a RequestHeader when asked."""
        self.request = request
        self._header = header
        if header is None:
            self.api_key = request.api_key
            self.api_version = request.api_version
            self.correlation_id = request.correlation_id
            self.client_id = client_id
        else:
            self.api_key = header.request_api_key
            self.api_version = header.request_api_version
            self.correlation_id = header.correlation_id
            self.client_id = header.client_id
        self.channel = channel
        self.on_response = on_response
        self._answered = False
        #: kbroker.server.authz.RequestAuthorizer of this request, made on first use
        self.authz = None
        #: the broker's QuotaManagers when any client quota is set, else None
        self.quotas = quotas
        #: set by the produce / fetch handler when a byte-rate quota is violated
        self.bandwidth_throttle_ms = 0
        #: monotonic ns when the handler returned (None while it runs): its thread time ends there
        self.handled_ns = None
        #: replica fetches and other cluster actions are not throttled (Kafka's sendResponseExemptThrottle)
        self.quota_exempt = False

    @property
    def header(self) -> RequestHeader:
        """The request header (made from the context's fields when it was not parsed)."""
        h = self._header
        if h is None:
            h = self._header = RequestHeader(request_api_key=self.api_key, request_api_version=self.api_version,
                                             correlation_id=self.correlation_id, client_id=self.client_id)
        return h

    @property
    def user(self) -> str:
        """The principal's name for quotas (``ANONYMOUS`` on an unauthenticated listener)."""
        conn = getattr(self.request, "connection", None)
        session = getattr(conn, "session", None)
        principal = getattr(session, "principal", None) or "User:ANONYMOUS"
        return principal.partition(":")[2] or principal

    def _throttle_ms(self, body, version: int) -> int:
        """Kafka's sendResponseMaybeThrottle: the request-time quota, then the larger of it
        and the bandwidth throttle, written into the response's throttle_time_ms."""
        q = self.quotas
        if self.quota_exempt or q is None:
            return self.bandwidth_throttle_ms
        throttle = self.bandwidth_throttle_ms
        if q.request.enabled:
            end = self.handled_ns or time.monotonic_ns()
            start = getattr(self.request, "dequeued_ns", 0) or end
            # nanoseconds of handler time as a percentage of one thread for one second
            used = max(0, end - start) * 100.0 / 1e9
            throttle = max(throttle, q.request.record_and_get_throttle_ms(self.user, self.client_id or "", used))
        if throttle > 0 and body is not None:
            _set_throttle_time(body, version, throttle)
        return throttle

    @property
    def connection_id(self) -> str:
        return self.request.connection_id

    @property
    def client_host(self) -> str:
        addr = self.request.client_address
        return addr[0] if addr else ""

    def _claim(self) -> bool:
        with _CLAIM_LOCK:
            if self._answered:
                return False
            self._answered = True
            return True

    def respond(self, body, version: int | None = None) -> None:
        """Encode ``body`` at the request's version (or ``version``) and send it; if it
        cannot be encoded, send the error response or close (see the module docstring)."""
        with _CLAIM_LOCK:                # _claim, inlined: once per request
            answered = self._answered
            self._answered = True
        if answered:
            log.warning("second response to %r ignored", self.request)
            return
        v = self.api_version if version is None else version
        throttle = self._throttle_ms(body, v) if self.quotas is not None or self.bandwidth_throttle_ms else 0
        try:
            parts = encode_response_parts(self.correlation_id, self.api_key, v, body)
        except Exception:
            name = API_INFO[self.api_key].name if self.api_key in API_INFO else "?"
            log.exception("cannot encode the %s v%d response (api key %d, correlation id %d) to %s",
                          name, v, self.api_key, self.correlation_id, self.connection_id)
            body = error_response(self.api_key, v, ErrorCode.UNKNOWN_SERVER_ERROR)
            parts = None
            if body is not None:
                try:
                    parts = encode_response_parts(self.correlation_id, self.api_key, v, body)
                except Exception:
                    log.exception("cannot encode the %s v%d error response either", name, v)
            if parts is None:
                log.info("closing connection %s: no %s v%d response could be encoded",
                         self.connection_id, name, v)
                self.channel.close_connection(self.request)
                return
        if throttle:
            self.channel.send_response(self.request, parts, throttle)
        else:
            self.channel.send_response(self.request, parts)
        if self.on_response is not None:
            self.on_response(self, body)

    def respond_no_op(self) -> None:
        if self._claim():
            throttle = self._throttle_ms(None, self.api_version) if self.quotas is not None or self.bandwidth_throttle_ms else 0
            if throttle:
                self.channel.send_no_op_response(self.request, throttle)
            else:
                self.channel.send_no_op_response(self.request)

    def close_connection(self) -> None:
        if self._claim():
            self.channel.close_connection(self.request)


def _set_throttle_time(body, version: int, ms: int) -> None:
    """Set ``throttle_time_ms`` when the response has it at ``version`` (old versions of
    some responses do not: then the muted connection alone throttles the client)."""
    field = next((f for f in type(body)._fields if f.attr == "throttle_time_ms"), None)
    if field is not None and field.versions is not None and field.versions[0] <= version <= field.versions[1]:
        body.throttle_time_ms = ms


def error_response(api_key: int, version: int, code: int):
    """A response body for ``api_key`` carrying ``code`` in its top-level error code, or
    None when the response has none at ``version`` (or cannot be encoded at it)."""
    info = API_INFO.get(api_key)
    if info is None:
        return None
    cls = info.response_class
    field = next((f for f in cls._fields if f.attr == "error_code"), None)
    if field is None or field.versions is None or not field.versions[0] <= version <= field.versions[1]:
        return None
    resp = cls()
    resp.error_code = code
    try:
        resp.encode(version)
    except Exception:
        return None
    return resp


def error_response_for(api_key: int, version: int, code: int, body):
    """Kafka's AbstractRequest.getErrorResponse: like :func:`error_response`, but for the admin
    APIs whose response has no top-level error code (CreateTopics, DeleteTopics,
    CreatePartitions, (Incremental)AlterConfigs, DescribeConfigs, AlterUserScramCredentials,
    AlterClientQuotas) the error goes in every per-item result of the request ``body``."""
    from kbroker.protocol.messages import (
        alter_client_quotas as ACQ, alter_configs as AC, alter_user_scram_credentials as AUSC,
        create_partitions as CP, create_topics as CT, delete_topics as DT, describe_configs as DC,
        incremental_alter_configs as IAC,
    )
    if body is not None:
        if api_key == ApiKey.CREATE_TOPICS:
            return CT.CreateTopicsResponse(topics=[CT.CreatableTopicResult(name=t.name, error_code=code)
                                                   for t in body.topics])
        if api_key == ApiKey.DELETE_TOPICS:
            named = [DT.DeletableTopicResult(name=n, error_code=code) for n in body.topic_names or []]
            named += [DT.DeletableTopicResult(name=t.name, topic_id=t.topic_id, error_code=code)
                      for t in body.topics or []]
            return DT.DeleteTopicsResponse(responses=named)
        if api_key == ApiKey.CREATE_PARTITIONS:
            return CP.CreatePartitionsResponse(results=[CP.CreatePartitionsTopicResult(name=t.name, error_code=code)
                                                        for t in body.topics])
        if api_key in (ApiKey.INCREMENTAL_ALTER_CONFIGS, ApiKey.ALTER_CONFIGS):
            m = IAC if api_key == ApiKey.INCREMENTAL_ALTER_CONFIGS else AC
            cls = m.IncrementalAlterConfigsResponse if m is IAC else m.AlterConfigsResponse
            return cls(responses=[m.AlterConfigsResourceResponse(error_code=code, resource_type=r.resource_type,
                                                                 resource_name=r.resource_name)
                                  for r in body.resources])
        if api_key == ApiKey.DESCRIBE_CONFIGS:
            return DC.DescribeConfigsResponse(results=[DC.DescribeConfigsResult(
                error_code=code, resource_type=r.resource_type, resource_name=r.resource_name)
                for r in body.resources])
        if api_key == ApiKey.ALTER_USER_SCRAM_CREDENTIALS:
            # Kafka's AlterUserScramCredentialsRequest.getErrorResponse: each user once, sorted
            users = sorted({x.name for x in list(body.deletions or ()) + list(body.upsertions or ())})
            return AUSC.AlterUserScramCredentialsResponse(results=[
                AUSC.AlterUserScramCredentialsResult(user=u, error_code=code, error_message=None) for u in users])
        if api_key == ApiKey.ALTER_CLIENT_QUOTAS:
            # Kafka's AlterClientQuotasRequest.getErrorResponse: every entry, its entity echoed
            return ACQ.AlterClientQuotasResponse(throttle_time_ms=0, entries=[
                ACQ.AlterClientQuotasResponseEntryData(
                    error_code=code, error_message=None,
                    entity=[ACQ.AlterClientQuotasResponseEntityData(entity_type=e.entity_type,
                                                                    entity_name=e.entity_name)
                            for e in entry.entity])
                for entry in body.entries])
    return error_response(api_key, version, code)
