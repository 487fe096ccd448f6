"""Protocol codecs: generated kbroker messages vs aiokafka's hand-written Struct classes.

ProduceRequest v7, one partition of 16 KiB records; FetchResponse v11, one partition of
16 KiB records. aiokafka is each group's reference (ratio > 1: we are faster). Both sides
encode to the same bytes (asserted once, outside the timed code).

    python -m pytest bench/kernels/bench_protocol.py --benchmark-only
"""
from __future__ import annotations

import random

import aiokafka.protocol.fetch as aio_fetch
import aiokafka.protocol.produce as aio_produce

from kbroker.protocol.messages.fetch import FetchableTopicResponse, FetchResponse, PartitionData
from kbroker.protocol.messages.produce import PartitionProduceData, ProduceRequest, TopicProduceData

RECORDS = random.Random(7).randbytes(16 * 1024)

OUR_PRODUCE = ProduceRequest(acks=-1, timeout_ms=30000, topic_data=[TopicProduceData(
    name="bench-topic", partition_data=[PartitionProduceData(index=0, records=RECORDS)])])
AIO_PRODUCE = aio_produce.ProduceRequest_v7(None, -1, 30000, [("bench-topic", [(0, RECORDS)])])
PRODUCE_BYTES = OUR_PRODUCE.encode(7)

OUR_FETCH = FetchResponse(throttle_time_ms=0, error_code=0, session_id=17, responses=[
    FetchableTopicResponse(topic="bench-topic", partitions=[PartitionData(
        partition_index=0, error_code=0, high_watermark=1000, last_stable_offset=1000,
        log_start_offset=0, aborted_transactions=[], preferred_read_replica=-1,
        records=RECORDS)])])
AIO_FETCH = aio_fetch.FetchResponse_v11(0, 0, 17, [("bench-topic", [(0, 0, 1000, 1000, 0, [], -1, RECORDS)])])
FETCH_BYTES = OUR_FETCH.encode(11)


def test_same_bytes_as_aiokafka():
    assert AIO_PRODUCE.encode() == PRODUCE_BYTES
    assert AIO_FETCH.encode() == FETCH_BYTES


def _bench(benchmark, group, fn, role=None):
    benchmark.group = group
    if role:
        benchmark.extra_info["role"] = role
    return benchmark(fn)


def test_produce_encode_aiokafka(benchmark):
    _bench(benchmark, "produce-v7-encode", AIO_PRODUCE.encode, "reference")


def test_produce_encode_ours(benchmark):
    assert _bench(benchmark, "produce-v7-encode", lambda: OUR_PRODUCE.encode(7)) == PRODUCE_BYTES


def test_produce_decode_aiokafka(benchmark):
    _bench(benchmark, "produce-v7-decode", lambda: aio_produce.ProduceRequest_v7.decode(PRODUCE_BYTES), "reference")


def test_produce_decode_ours(benchmark):
    _bench(benchmark, "produce-v7-decode", lambda: ProduceRequest.decode(PRODUCE_BYTES, 7))


def test_fetch_encode_aiokafka(benchmark):
    _bench(benchmark, "fetch-v11-encode", AIO_FETCH.encode, "reference")


def test_fetch_encode_ours(benchmark):
    _bench(benchmark, "fetch-v11-encode", lambda: OUR_FETCH.encode(11))


def test_fetch_encode_parts_ours(benchmark):
    _bench(benchmark, "fetch-v11-encode", lambda: OUR_FETCH.encode_parts(11))


def test_fetch_decode_aiokafka(benchmark):
    _bench(benchmark, "fetch-v11-decode", lambda: aio_fetch.FetchResponse_v11.decode(FETCH_BYTES), "reference")


def test_fetch_decode_ours(benchmark):
    _bench(benchmark, "fetch-v11-decode", lambda: FetchResponse.decode(FETCH_BYTES, 11))
