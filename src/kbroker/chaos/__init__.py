"""Fault injection and history checking for Jepsen-style tests of kbroker (issues 16, 17).

- :mod:`kbroker.chaos.checker`: the queue-workload verdict over a history of sends and
  the final reads (lost, duplicated, reordered, reassigned records); pure.
- :mod:`kbroker.chaos.proxy`: a TCP proxy between clients (or brokers) and a broker that
  kills, delays, drops or holds traffic on command.
- :mod:`kbroker.chaos.nemesis`: seeded fault schedules over broker processes (SIGKILL and
  restart, SIGSTOP/SIGCONT pauses, proxy partitions).
- :mod:`kbroker.chaos.workload`: the queue workload itself with unchanged clients
  (confluent-kafka or kbroker.client producers with acks=all and idempotence, a reader
  to the end).
- :mod:`kbroker.chaos.cluster`: a KRaft cluster (1 controller + 3 brokers) with faults on
  one broker by PID and a cut-off from peers and controller through per-node proxies,
  and :class:`~kbroker.chaos.cluster.ClusterNemesis`, seeded schedules over it.

Everything is bounded in count and time, and only touches processes the test started.
"""
