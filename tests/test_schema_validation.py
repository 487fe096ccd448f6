"""SchemaIdValidator's caches and bounds against a stub registry (GET /schemas/ids/{id}/versions):
a registered (subject, id) is asked once for the life of the process, a refused one again only
after the negative TTL, concurrent misses share one request, an unreachable registry fails fast
for DOWN_BACKOFF_S after a failure."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kbroker.server import schema_validation as sv
from kbroker.testing import free_port


class StubRegistry:
    def __init__(self):
        self.subjects: dict[int, list[str]] = {}
        self.hits: list[int] = []
        self.delay_s = 0.0
        self.status = 200
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                sid = int(self.path.split("/")[3])
                stub.hits.append(sid)
                time.sleep(stub.delay_s)
                if stub.status != 200:
                    self.send_response(stub.status)
                    self.end_headers()
                    return
                if sid not in stub.subjects:
                    body, code = {"error_code": 40403, "message": "Schema not found"}, 404
                else:
                    body, code = [{"subject": s, "version": 1} for s in stub.subjects[sid]], 200
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.handle_error = lambda *a: None  # a client that gave up: a broken pipe, expected
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    s = StubRegistry()
    yield s
    s.close()


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_positive_answers_are_kept_negative_ones_expire(stub):
    stub.subjects = {1: ["t-value", "u-value"], 2: ["other-value"]}
    clock = Clock()
    v = sv.SchemaIdValidator([stub.url], negative_cache_ms=5000, clock=clock)
    assert v.refused("t", [(1, 1), (1, 2), (1, 3)]) == {(1, 2), (1, 3)}
    assert stub.hits == [1, 2, 3]
    clock.t += 3600
    assert v.refused("t", [(1, 1)]) == set()               # registered: never asked again
    assert stub.hits == [1, 2, 3]
    assert v.refused("u", [(1, 1)]) == set()               # the same answer listed u-value
    assert stub.hits == [1, 2, 3]
    assert v.refused("t", [(0, 1)]) == {(0, 1)}            # t-key is another subject: asked
    assert stub.hits == [1, 2, 3, 1]
    stub.subjects[2].append("t-value")                     # registered there since
    clock.t += 1
    assert v.refused("t", [(1, 2)]) == set()               # t-value/2 had expired: asked again
    assert stub.hits[-1] == 2
    assert v.refused("t", [(0, 1)]) == {(0, 1)}            # t-key/1 still in its negative TTL
    assert stub.hits.count(1) == 2


def test_concurrent_misses_share_one_request(stub):
    stub.subjects = {7: ["t-value"]}
    stub.delay_s = 0.3
    v = sv.SchemaIdValidator([stub.url])
    out = []
    threads = [threading.Thread(target=lambda: out.append(v.refused("t", [(1, 7)]))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert out == [set()] * 8 and stub.hits == [7]


def test_unreachable_registry_fails_within_the_timeout_then_fast(stub):
    stub.subjects = {1: ["t-value"]}
    stub.delay_s = 3.0
    v = sv.SchemaIdValidator([stub.url], timeout_ms=300)
    started = time.monotonic()
    with pytest.raises(sv.RegistryUnavailable):
        v.refused("t", [(1, 1)])
    assert time.monotonic() - started < 2.0
    started = time.monotonic()
    with pytest.raises(sv.RegistryUnavailable):            # down: answered without asking
        v.refused("t", [(1, 1)])
    assert time.monotonic() - started < 0.1 and stub.hits == [1]
    stub.delay_s, stub.status = 0.0, 503
    time.sleep(sv.DOWN_BACKOFF_S)
    with pytest.raises(sv.RegistryUnavailable, match="HTTP 503"):
        v.refused("t", [(1, 1)])
    stub.status = 200
    time.sleep(sv.DOWN_BACKOFF_S)
    assert v.refused("t", [(1, 1)]) == set()
    # the second URL is tried when the first refuses connections
    w = sv.SchemaIdValidator([f"http://127.0.0.1:{free_port()}", stub.url])
    assert w.refused("t", [(1, 1)]) == set()
