"""A partition's replicas (Kafka's ``kafka.cluster`` and the replica fetcher). Pure state
machines: no threads, no sockets, a clock passed in; the only I/O is the local log's.

| Module | Owns | Kafka model |
|---|---|---|
| ``replica.py`` | what a leader knows of one follower (log end, caught-up time) | ``Replica`` |
| ``partition_leader.py`` | the leader's ISR (committed / pending expand / shrink), HW candidate, acks=all rules | ``Partition`` (leader half) |
| ``alter_partition.py`` | a broker's ISR proposals batched to the controller | ``DefaultAlterPartitionManager`` |
| ``follower_fetch.py`` | the leader's answer to a follower's Fetch: epochs, diverging epoch, read, follower state, HW | ``Partition.fetchRecords`` |
| ``replica_fetcher.py`` | a follower's fetch loop towards one leader: Fetch v17, append, truncation, errors | ``AbstractFetcherThread`` / ``ReplicaFetcherThread`` |
| ``simulation.py`` | the seeded simulation of all of it on real logs (``python -m kbroker.cluster.simulation``) | |
"""
