"""A transactional consume-transform-produce copier for the exactly-once tests (run as
``python -m tests.broker.eos_copier BOOTSTRAP SRC DST GROUP TID PARTITIONS BATCH``).

Reads every partition of SRC from the group's committed offsets (read_committed, assigned,
not subscribed: a restarted copier need not wait for the killed one's session to end),
writes each record to the same partition of DST, and commits the consumed offsets with
the transaction (send_offsets_to_transaction), BATCH records per transaction. Prints
``ready`` once initialized (its init fences any earlier copier of TID) and ``committed N``
after each commit; exits 0 once its committed offsets reach SRC's end offsets, 3 when it
is fenced (a newer copier of TID exists)."""
from __future__ import annotations

import sys

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition


def main() -> int:
    bootstrap, src, dst, group, tid, partitions, batch = sys.argv[1:8]
    partitions, batch = int(partitions), int(batch)
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 2,
                  "transaction.timeout.ms": 60000, "reconnect.backoff.max.ms": 1000})
    p.init_transactions(60)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                  "enable.partition.eof": False, "reconnect.backoff.max.ms": 1000})
    tps = [TopicPartition(src, i) for i in range(partitions)]
    ends = {tp.partition: c.get_watermark_offsets(tp, timeout=30)[1] for tp in tps}
    committed = c.committed(tps, timeout=30)
    c.assign([TopicPartition(src, tp.partition, tp.offset if tp.offset >= 0 else 0) for tp in committed])
    positions = {tp.partition: max(tp.offset, 0) for tp in committed}
    print("ready", flush=True)
    total = 0
    try:
        while any(positions[i] < ends[i] for i in ends):
            msgs = [m for m in c.consume(batch, 0.5) if m.error() is None]
            if not msgs:
                continue
            p.begin_transaction()
            for m in msgs:
                p.produce(dst, value=b"copy-" + m.value(), partition=m.partition())
                positions[m.partition()] = m.offset() + 1
            p.send_offsets_to_transaction([TopicPartition(src, i, o) for i, o in positions.items()],
                                          c.consumer_group_metadata(), 30)
            p.commit_transaction(30)
            total += len(msgs)
            print(f"committed {total}", flush=True)
    except KafkaException as e:
        err = e.args[0]
        print(f"failed: {err}", flush=True)
        return 3 if err.fatal() or "fenced" in str(err).lower() else 1
    finally:
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
