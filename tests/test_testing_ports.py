"""kbroker.testing.free_port: ports for brokers that tests start, without collisions."""
import kbroker.testing as testing


def test_xdist_workers_draw_from_disjoint_slices(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    spans = []
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        spans.append(testing._port_span(10000, 32767))
    (a_lo, a_hi), (b_lo, b_hi) = spans
    assert 10000 <= a_lo <= a_hi < b_lo <= b_hi <= 32767
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert testing._port_span(10000, 32767) == (10000, 32767)


def test_a_process_never_hands_out_a_port_twice(monkeypatch):
    monkeypatch.setattr(testing, "_handed_out", set())
    lo, _ = testing._ephemeral_range()
    ports = [testing.free_port() for _ in range(600)]
    assert len(set(ports)) == len(ports)
    if lo > 12000:
        span = testing._port_span(10000, lo - 1)
        assert all(span[0] <= p <= span[1] for p in ports)
