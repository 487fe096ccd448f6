"""Two registry instances on one cluster: one elected writer (consumer group), the other
forwards; writes through either land once; the survivor takes over when the leader stops."""
import json
import threading
import time
import uuid

from kbroker.schema_registry.testing import SchemaRegistryProcess
from tests.schema_registry.test_rest_api import avro, call


def wait_for(cond, timeout_s=30.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_two_instances_write_once_and_fail_over(broker, registry):
    second = SchemaRegistryProcess(broker.bootstrap).start()
    try:
        pair = [registry, second]
        s = "multi-" + uuid.uuid4().hex[:8]
        # the same schema through both instances at once: one id, one version
        results, errs = [], []

        def reg(r):
            st, b, _ = call(r, "POST", f"/subjects/{s}/versions", {"schema": avro(1)})
            (results if st == 200 else errs).append((st, b))

        threads = [threading.Thread(target=reg, args=(pair[i % 2],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errs, errs
        assert len({b["id"] for _, b in results}) == 1
        assert call(registry, "GET", f"/subjects/{s}/versions")[1] == [1]
        # different schemas through both at once: each lands as its own version and id
        # (two writers would both allocate the next version and id, and one would be lost)
        got = {}

        def reg_n(n):
            st, b, _ = call(pair[n % 2], "POST", f"/subjects/{s}/versions", {"schema": avro(n)})
            got[n] = (st, b)

        threads = [threading.Thread(target=reg_n, args=(n,)) for n in range(2, 8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert all(st == 200 for st, _ in got.values()), got
        ids = [results[0][1]["id"]] + [b["id"] for _, b in got.values()]
        assert len(set(ids)) == len(ids)
        for n, (_, b) in got.items():
            assert call(registry, "GET", f"/schemas/ids/{b['id']}")[1] == {"schema": avro(n)}
        for r in pair:  # both converge on the same state (the follower reads the topic itself)
            wait_for(lambda: call(r, "GET", f"/subjects/{s}/versions")[1] == list(range(1, 8)),
                     what="both instances to see versions 1..7")
        assert ({json.dumps(call(second, "GET", f"/subjects/{s}/versions/{v}")[1]) for v in range(1, 8)} ==
                {json.dumps(call(registry, "GET", f"/subjects/{s}/versions/{v}")[1]) for v in range(1, 8)})

        # the leader (whichever it is) goes away: the other one writes from then on
        third = SchemaRegistryProcess(broker.bootstrap).start()
        try:
            assert second.terminate() == 0
            for r in (registry, third):
                st, b, _ = call(r, "POST", f"/subjects/{s}/versions", {"schema": avro(8 + (r is third))})
                assert st == 200, b
            wait_for(lambda: call(third, "GET", f"/subjects/{s}/versions")[1] == list(range(1, 10)),
                     what="versions 1..9 after fail-over")
            assert third.terminate() == 0
        finally:
            third.terminate()
            third.__exit__(None, None, None)
    finally:
        second.terminate()
        second.__exit__(None, None, None)
