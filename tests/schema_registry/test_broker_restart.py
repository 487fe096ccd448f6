"""The registry outlives a restart of its broker: reads keep being served from memory,
writes fail with a documented error while the broker is away and work again after."""
import time
import uuid

from kbroker.schema_registry.testing import SchemaRegistryProcess
from kbroker.testing import KBrokerProcess
from tests.schema_registry.test_rest_api import avro, call


def test_registry_survives_a_broker_restart(tmp_path):
    overrides = {"num.partitions": 1, "group.initial.rebalance.delay.ms": 0}
    b = KBrokerProcess(data_dir=str(tmp_path), overrides=overrides).start()
    r = SchemaRegistryProcess(b.bootstrap)
    try:
        r.start()
        s = "restart-" + uuid.uuid4().hex[:6]
        st, first, _ = call(r, "POST", f"/subjects/{s}/versions", {"schema": avro(1)})
        assert st == 200, first
        assert b.terminate() == 0
        assert call(r, "GET", f"/schemas/ids/{first['id']}")[0] == 200   # served from memory
        b = KBrokerProcess(data_dir=str(tmp_path), overrides=overrides, port=b.port).start()
        deadline = time.monotonic() + 60
        while True:
            st, body, _ = call(r, "POST", f"/subjects/{s}/versions", {"schema": avro(2)})
            if st == 200:
                break
            assert st == 500 and body["error_code"] in (50001, 50002, 50003, 50004), body
            assert time.monotonic() < deadline, body
            time.sleep(0.2)
        assert call(r, "GET", f"/subjects/{s}/versions")[1] == [1, 2]
        assert r.terminate() == 0
        assert "Traceback" not in r.read_log(), r.read_log()[-4000:]
    finally:
        r.kill()
        r.__exit__(None, None, None)
        b.terminate()
        b.__exit__(None, None, None)
