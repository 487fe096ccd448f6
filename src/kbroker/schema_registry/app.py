"""The REST API (Confluent Schema Registry's paths) on Starlette.

Every response is ``application/vnd.schemaregistry.v1+json``; errors are
``{"error_code", "message"}``. Request bodies: JSON with content type
``application/vnd.schemaregistry.v1+json``, ``application/vnd.schemaregistry+json``,
``application/json`` or ``application/octet-stream`` (or none), at most
``max_request_bytes`` (else 42209; the rest of the body is read and dropped up to
``DRAIN_LIMIT_BYTES``, so the client gets the answer). Route handlers are synchronous and
run in Starlette's thread pool: the service blocks on the ``_schemas`` topic. Writes
(POST/PUT/DELETE other than lookups and compatibility tests) on an instance that is not
the elected leader are forwarded to the leader's URL (leader.py), once: a forwarded
request that reaches a non-leader gets 50003.
"""
from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kbroker.schema_registry import errors, formats
from kbroker.schema_registry.errors import RestError
from kbroker.schema_registry.service import SchemaRegistry

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
FORWARDED_HEADER = "X-Kbroker-Forwarded"
FORWARD_TIMEOUT_S = 30.0
LEADER_WAIT_S = 15.0
DRAIN_LIMIT_BYTES = 64 << 20   # past this a too-large body is not even read: the connection closes
ACCEPTED_BODY_TYPES = ("application/vnd.schemaregistry.v1+json", "application/vnd.schemaregistry+json",
                       "application/json", "application/octet-stream")


def _json(body, status: int = 200) -> Response:
    return Response(json.dumps(body), status_code=status, media_type=CONTENT_TYPE)


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "false").lower() == "true"


def _int_param(request: Request, name: str, default: int) -> int:
    try:
        return int(request.query_params.get(name, default))
    except ValueError:
        raise RestError(400, 400, f"query parameter {name} is not an integer") from None


def _page(items: list, request: Request) -> list:
    offset, limit = _int_param(request, "offset", 0), _int_param(request, "limit", -1)
    items = items[max(offset, 0):]
    return items if limit < 0 else items[:limit]


def build_app(registry: SchemaRegistry, max_request_bytes: int = 1 << 20) -> Starlette:
    """The Starlette app. Handlers with a body (writes, lookups, compatibility tests) and
    deletes run in the thread pool (they may block on the topic or parse a schema); GETs
    run on the event loop."""
    state = registry.state

    async def read_body(request: Request) -> bytes:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype and ctype not in ACCEPTED_BODY_TYPES:
            raise RestError(415, 415, f"HTTP 415 Unsupported Media Type: {ctype}")
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > DRAIN_LIMIT_BYTES:
            raise errors.schema_too_large(max_request_bytes)  # and the connection closes
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > DRAIN_LIMIT_BYTES:
                raise errors.schema_too_large(max_request_bytes)
            if size <= max_request_bytes:
                chunks.append(chunk)
        # a body over the limit is read to its end and dropped, so that a client still
        # sending it gets the 42209 answer rather than a reset connection
        if size > max_request_bytes:
            raise errors.schema_too_large(max_request_bytes)
        return b"".join(chunks)

    def parse_body(raw: bytes):
        try:
            return json.loads(raw)
        except ValueError as e:
            raise RestError(400, 400, f"Unexpected character in the JSON body: {e}") from None
        except RecursionError:
            raise RestError(400, 400, "The JSON body nests too deeply") from None

    class _Unreachable(Exception):
        pass

    def forward(request: Request, raw: bytes | None, leader_url: str) -> Response:
        """Send a write to the leader and hand its answer back unchanged; ``_Unreachable``
        when the leader cannot be reached (the caller looks it up again and retries)."""
        if request.headers.get(FORWARDED_HEADER):
            raise RestError(500, 50003, "Error while forwarding the request to the leader: "
                                        "the leader this request was forwarded to is no longer the leader")
        url = leader_url + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = {FORWARDED_HEADER: "1", "Accept": CONTENT_TYPE}
        if raw is not None:
            headers["Content-Type"] = CONTENT_TYPE
        req = urllib.request.Request(url, data=raw, method=request.method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=FORWARD_TIMEOUT_S) as r:
                return Response(r.read(), status_code=r.status, media_type=CONTENT_TYPE)
        except urllib.error.HTTPError as e:
            return Response(e.read(), status_code=e.code, media_type=CONTENT_TYPE)
        except (OSError, urllib.error.URLError) as e:
            registry.elector.forget_leader()
            raise _Unreachable(f"{leader_url}: {e}") from None

    def lead_or_forward(request: Request, raw: bytes | None) -> Response | None:
        """None when this instance leads (handle it here), else the leader's response. A
        leader that went away is looked up again until one answers or LEADER_WAIT_S ends
        (a rebalance after a leader stops takes about a heartbeat interval)."""
        deadline = time.monotonic() + LEADER_WAIT_S
        while True:
            leads, url = registry.elector.await_leader(max(deadline - time.monotonic(), 0.0))
            if leads:
                return None
            try:
                return forward(request, raw, url)
            except _Unreachable as e:
                if time.monotonic() >= deadline:
                    raise RestError(500, 50003, f"Error while forwarding the request to the leader {e}") from None
                time.sleep(0.1)

    def route(path, methods, needs_body=False, write=False):
        """Wrap a synchronous handler(request, params, body) into an async endpoint. A
        ``write`` on an instance that does not lead is forwarded to the leader."""
        def deco(fn):
            async def endpoint(request: Request):
                try:
                    raw = await read_body(request) if needs_body else None
                    if write and registry.elector is not None:
                        forwarded = await run_in_threadpool(lead_or_forward, request, raw)
                        if forwarded is not None:
                            return forwarded
                    if methods == ["GET"]:  # in-memory and short (the state lock is held per record applied)
                        result = fn(request, request.path_params, None)
                    else:
                        b = parse_body(raw) if needs_body else None
                        result = await run_in_threadpool(fn, request, request.path_params, b)
                except RestError as e:
                    return _json(e.body(), e.status)
                if isinstance(result, Response):
                    return result
                return _json(result)
            return Route(path, endpoint, methods=methods)
        return deco

    routes = []

    def add(path, methods, needs_body=False):
        write = methods != ["GET"] and not path.startswith("/compatibility") and not (
            methods == ["POST"] and path == "/subjects/{subject:path}")  # lookups are reads
        def deco(fn):
            routes.append(route(path, methods, needs_body, write)(fn))
            return fn
        return deco

    # -- root, types ------------------------------------------------------------------
    @add("/", ["GET"])
    def root(request, p, b):
        return {}

    @add("/schemas/types", ["GET"])
    def schema_types(request, p, b):
        return list(formats.TYPES)

    @add("/v1/metadata/id", ["GET"])
    def metadata_id(request, p, b):
        return {"scope": {"path": [], "clusters": {"kafka-cluster": registry.store.bootstrap}}}

    # -- schemas by id ------------------------------------------------------------------
    def _id(p) -> int:
        try:
            return int(p["id"])
        except ValueError:
            raise errors.schema_not_found(p["id"]) from None

    @add("/schemas/ids/{id}", ["GET"])
    def schema_by_id(request, p, b):
        return registry.schema_by_id(_id(p), request.query_params.get("format"))

    @add("/schemas/ids/{id}/schema", ["GET"])
    def raw_schema_by_id(request, p, b):
        s = registry.schema_by_id(_id(p), request.query_params.get("format"))["schema"]
        return Response(s, media_type=CONTENT_TYPE)

    @add("/schemas/ids/{id}/subjects", ["GET"])
    def subjects_by_id(request, p, b):
        sid = _id(p)
        registry.schema_by_id(sid)
        with state.lock:
            subs = sorted({s for s, _ in state.usages(sid, _flag(request, "deleted"))})
        return _page(subs, request)

    @add("/schemas/ids/{id}/versions", ["GET"])
    def versions_by_id(request, p, b):
        sid = _id(p)
        registry.schema_by_id(sid)
        with state.lock:
            uses = state.usages(sid, _flag(request, "deleted"))
        return _page([{"subject": s, "version": v} for s, v in uses], request)

    @add("/schemas", ["GET"])
    def schemas(request, p, b):
        prefix = request.query_params.get("subjectPrefix", "")
        deleted = _flag(request, "deleted")
        with state.lock:
            out = [registry.version_body(s, sv) for s in sorted(state.subjects) if s.startswith(prefix)
                   for sv in state.live_versions(s, deleted)]
        return _page(out, request)

    # -- subjects -----------------------------------------------------------------------
    @add("/subjects", ["GET"])
    def subjects(request, p, b):
        deleted = _flag(request, "deleted")
        prefix = request.query_params.get("subjectPrefix", "")
        with state.lock:
            subs = [s for s in sorted(state.subjects) if s.startswith(prefix) and state.live_versions(s, deleted)]
        return _page(subs, request)

    @add("/subjects/{subject:path}/versions", ["GET"])
    def versions(request, p, b):
        subject = p["subject"]
        with state.lock:
            vs = [sv.version for sv in state.live_versions(subject, _flag(request, "deleted"))]
        if not vs:
            raise errors.subject_not_found(subject)
        return _page(vs, request)

    @add("/subjects/{subject:path}/versions", ["POST"], needs_body=True)
    def register(request, p, b):
        return registry.register(p["subject"], b, _flag(request, "normalize"))

    @add("/subjects/{subject:path}/versions/{version}", ["GET"])
    def get_version(request, p, b):
        sv = registry.parse_version(p["subject"], p["version"], _flag(request, "deleted"))
        return registry.version_body(p["subject"], sv, request.query_params.get("format"))

    @add("/subjects/{subject:path}/versions/{version}/schema", ["GET"])
    def get_version_schema(request, p, b):
        sv = registry.parse_version(p["subject"], p["version"], _flag(request, "deleted"))
        return Response(registry.version_body(p["subject"], sv)["schema"], media_type=CONTENT_TYPE)

    @add("/subjects/{subject:path}/versions/{version}/referencedby", ["GET"])
    def referenced_by(request, p, b):
        sv = registry.parse_version(p["subject"], p["version"], True)
        with state.lock:
            return _page(state.referenced_by(p["subject"], sv.version), request)

    @add("/subjects/{subject:path}/versions/{version}", ["DELETE"])
    def delete_version(request, p, b):
        return registry.delete_version(p["subject"], p["version"], _flag(request, "permanent"))

    @add("/subjects/{subject:path}", ["POST"], needs_body=True)
    def lookup(request, p, b):
        return registry.lookup(p["subject"], b, _flag(request, "normalize"), _flag(request, "deleted"))

    @add("/subjects/{subject:path}", ["DELETE"])
    def delete_subject(request, p, b):
        return registry.delete_subject(p["subject"], _flag(request, "permanent"))

    # -- compatibility ------------------------------------------------------------------
    @add("/compatibility/subjects/{subject:path}/versions/{version}", ["POST"], needs_body=True)
    def compat_version(request, p, b):
        return registry.test_compatibility(p["subject"], p["version"], b, _flag(request, "normalize"),
                                           _flag(request, "verbose"))

    @add("/compatibility/subjects/{subject:path}/versions", ["POST"], needs_body=True)
    def compat_all(request, p, b):
        return registry.test_compatibility(p["subject"], None, b, _flag(request, "normalize"),
                                           _flag(request, "verbose"))

    # -- config and mode ----------------------------------------------------------------
    @add("/config", ["GET"])
    def get_global_config(request, p, b):
        return registry.get_config(None, True)

    @add("/config", ["PUT"], needs_body=True)
    def put_global_config(request, p, b):
        return registry.set_config(None, b)

    @add("/config", ["DELETE"])
    def delete_global_config(request, p, b):
        return registry.delete_config(None)

    @add("/config/{subject:path}", ["GET"])
    def get_config(request, p, b):
        return registry.get_config(p["subject"], _flag(request, "defaultToGlobal"))

    @add("/config/{subject:path}", ["PUT"], needs_body=True)
    def put_config(request, p, b):
        return registry.set_config(p["subject"], b)

    @add("/config/{subject:path}", ["DELETE"])
    def delete_config(request, p, b):
        return registry.delete_config(p["subject"])

    @add("/mode", ["GET"])
    def get_global_mode(request, p, b):
        return registry.get_mode(None, True)

    @add("/mode", ["PUT"], needs_body=True)
    def put_global_mode(request, p, b):
        return registry.set_mode(None, b, _flag(request, "force"))

    @add("/mode/{subject:path}", ["GET"])
    def get_mode(request, p, b):
        return registry.get_mode(p["subject"], _flag(request, "defaultToGlobal"))

    @add("/mode/{subject:path}", ["PUT"], needs_body=True)
    def put_mode(request, p, b):
        return registry.set_mode(p["subject"], b, _flag(request, "force"))

    @add("/mode/{subject:path}", ["DELETE"])
    def delete_mode(request, p, b):
        return registry.delete_mode(p["subject"])

    @add("/contexts", ["GET"])
    def contexts(request, p, b):
        return ["."]

    async def http_error(request, exc: HTTPException):
        return _json({"error_code": exc.status_code, "message": f"HTTP {exc.status_code} {exc.detail}"},
                     exc.status_code)

    async def server_error(request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _json({"error_code": 50001, "message": f"Internal error: {type(exc).__name__}: {exc}"}, 500)

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})
