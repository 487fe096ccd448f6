"""Transaction coordinator APIs: AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
DescribeTransactions, ListTransactions; and TxnOffsetCommit (the group coordinator's).

Kafka: the transaction parts of ``core/.../server/KafkaApis.scala`` (request →
coordinator call → response, per-version error rules). The logic is in
:class:`kbroker.coordinator.transaction.TransactionCoordinator`
(``broker.transaction_coordinator``); InitProducerId is in :mod:`.producer_id`,
FindCoordinator(TRANSACTION) in :mod:`.group`. No authorizer: the ACL checks
(TRANSACTIONAL_ID, GROUP, TOPIC, CLUSTER_ACTION for v4+ AddPartitionsToTxn) pass.

Version rules: AddPartitionsToTxn, AddOffsetsToTxn and EndTxn below v2 answer
INVALID_PRODUCER_EPOCH where the coordinator says PRODUCER_FENCED (clients that old
do not know it). AddPartitionsToTxn v0-3 is the client's form (one transaction);
v4+ is the brokers' batched form, with ``verify_only`` (KIP-890 part 1: is the
partition in the ongoing transaction?). A partition of an unknown topic fails the
whole transaction's request: UNKNOWN_TOPIC_OR_PARTITION for it,
OPERATION_NOT_ATTEMPTED for the others.

TxnOffsetCommit goes to the group coordinator (``commit_transactional_offsets``):
written as the producer's transactional batch, visible once the COMMIT marker reaches
the group's ``__consumer_offsets`` partition. Before that, KIP-890 part 1: unless the
producer's transaction is already open there, the partition's verification guard is
taken and the transaction coordinator (here or on another broker: the replica manager's
verifier, :mod:`kbroker.server.txn_verification`) must confirm that partition was added
to the producer's ongoing transaction (AddOffsetsToTxn), else the commit is refused;
the append then needs the guard still in place (Kafka's
AddPartitionsToTxnManager mapping: PRODUCER_FENCED → INVALID_PRODUCER_EPOCH,
TRANSACTION_ABORTABLE → INVALID_TXN_STATE below v4). Below v2,
COORDINATOR_LOAD_IN_PROGRESS is answered COORDINATOR_NOT_AVAILABLE (KAFKA-7296).

Answers come from the coordinator's callbacks, possibly on another thread;
``ctx.respond`` is thread-safe and answers once.
"""
from __future__ import annotations

import threading

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import describe_transactions as dt
from kbroker.protocol.messages import list_transactions as lt
from kbroker.protocol.messages.add_offsets_to_txn import AddOffsetsToTxnResponse
from kbroker.protocol.messages.add_partitions_to_txn import (
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResponse, AddPartitionsToTxnResult,
    AddPartitionsToTxnTopicResult,
)
from kbroker.protocol.messages.end_txn import EndTxnResponse
from kbroker.protocol.messages.txn_offset_commit import (
    TxnOffsetCommitResponse, TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
)
from kbroker.server import txn_verification
from kbroker.server.apis import ApiHandler
from kbroker.server.authz import CLUSTER_ACTION, DESCRIBE, GROUP, READ, TOPIC, TRANSACTIONAL_ID, WRITE, authz

E = ErrorCode
OFFSETS_TOPIC = "__consumer_offsets"
TV2 = 2     # transaction.version 2 (KIP-890 part 2)


def _coordinator(broker):
    return getattr(broker, "transaction_coordinator", None)


def _fenced_for(version: int, err: ErrorCode, first_version_with_fenced: int = 2) -> ErrorCode:
    if version < first_version_with_fenced and err == E.PRODUCER_FENCED:
        return E.INVALID_PRODUCER_EPOCH
    return err


def _partition_exists(broker, topic: str, partition: int) -> bool:
    t = broker.metadata.image.topics.get(topic)
    return t is not None and 0 <= partition < t.num_partitions


def _topic_results(errors: dict) -> list:
    by_topic: dict[str, list] = {}
    for (topic, p), err in sorted(errors.items()):
        by_topic.setdefault(topic, []).append(AddPartitionsToTxnPartitionResult(partition_index=p,
                                                                                 partition_error_code=err))
    return [AddPartitionsToTxnTopicResult(name=t, results_by_partition=ps) for t, ps in by_topic.items()]


# -- AddPartitionsToTxn ---------------------------------------------------------------------------

def _add_partitions_one(broker, version: int, transactional_id: str, producer_id: int, producer_epoch: int,
                        topics, verify_only: bool, done) -> None:
    """One transaction of the request; ``done({(topic, partition): error})``."""
    partitions = [(t.name, p) for t in topics for p in t.partitions]
    coordinator = _coordinator(broker)
    if coordinator is None:
        done({tp: E.COORDINATOR_NOT_AVAILABLE for tp in partitions})
        return
    missing = {tp for tp in partitions if not _partition_exists(broker, *tp)}
    if missing:
        done({tp: (E.UNKNOWN_TOPIC_OR_PARTITION if tp in missing else E.OPERATION_NOT_ATTEMPTED)
              for tp in partitions})
        return
    if verify_only:
        done(coordinator.handle_verify_partitions(transactional_id, producer_id, producer_epoch, partitions))
        return
    # v5's adds come from partition leaders for transaction version 2 producers (KIP-890 part 2)
    coordinator.handle_add_partitions(
        transactional_id, producer_id, producer_epoch, partitions,
        lambda err: done({tp: _fenced_for(version, err) for tp in partitions}), TV2 if version >= 5 else 0)


def _txn_denied(auth, transactional_id: str, topics) -> dict | None:
    """KafkaApis' AddPartitionsToTxn checks (client versions): WRITE on the transactional id,
    then WRITE on each topic; the errors per partition, or None when allowed."""
    if auth is None:
        return None
    partitions = [(t.name, p) for t in topics for p in t.partitions]
    if not auth.allowed(WRITE, TRANSACTIONAL_ID, transactional_id):
        return {tp: E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED for tp in partitions}
    denied = {t.name for t in topics if not auth.allowed(WRITE, TOPIC, t.name)}
    if denied:
        return {tp: E.TOPIC_AUTHORIZATION_FAILED if tp[0] in denied else E.OPERATION_NOT_ATTEMPTED
                for tp in partitions}
    return None


def handle_add_partitions_to_txn(broker, ctx, req) -> None:
    v = ctx.api_version
    auth = authz(broker, ctx)
    if v < 4:
        def done_v3(errors: dict) -> None:
            ctx.respond(AddPartitionsToTxnResponse(throttle_time_ms=0,
                                                   results_by_topic_v3_and_below=_topic_results(errors)))

        denied = _txn_denied(auth, req.v3_and_below_transactional_id, req.v3_and_below_topics)
        if denied is not None:
            done_v3(denied)
            return

        _add_partitions_one(broker, v, req.v3_and_below_transactional_id, req.v3_and_below_producer_id,
                            req.v3_and_below_producer_epoch, req.v3_and_below_topics, False, done_v3)
        return
    if auth is not None and not auth.cluster(CLUSTER_ACTION):
        # v4+ is the brokers' batched verification (KIP-890): CLUSTER_ACTION on the cluster
        ctx.respond(AddPartitionsToTxnResponse(throttle_time_ms=0, error_code=E.CLUSTER_AUTHORIZATION_FAILED,
                                               results_by_transaction=[]))
        return
    txns = list(req.transactions)
    results: list = []
    lock = threading.Lock()

    def done_one(tid: str, errors: dict) -> None:
        with lock:
            results.append(AddPartitionsToTxnResult(transactional_id=tid, topic_results=_topic_results(errors)))
            complete = len(results) == len(txns)
        if complete:
            ctx.respond(AddPartitionsToTxnResponse(throttle_time_ms=0, error_code=0,
                                                   results_by_transaction=results))

    if not txns:
        ctx.respond(AddPartitionsToTxnResponse(throttle_time_ms=0, error_code=0, results_by_transaction=[]))
        return
    for t in txns:
        _add_partitions_one(broker, v, t.transactional_id, t.producer_id, t.producer_epoch, t.topics,
                            t.verify_only, lambda errors, tid=t.transactional_id: done_one(tid, errors))


# -- AddOffsetsToTxn / EndTxn -----------------------------------------------------------------------

def handle_add_offsets_to_txn(broker, ctx, req) -> None:
    v = ctx.api_version
    coordinator = _coordinator(broker)

    def respond(err: ErrorCode) -> None:
        ctx.respond(AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=_fenced_for(v, err)))

    auth = authz(broker, ctx)
    if auth is not None:      # KafkaApis: WRITE on the transactional id, READ on the group
        if not auth.allowed(WRITE, TRANSACTIONAL_ID, req.transactional_id):
            return respond(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        if not auth.allowed(READ, GROUP, req.group_id):
            return respond(E.GROUP_AUTHORIZATION_FAILED)
    if coordinator is None:
        return respond(E.COORDINATOR_NOT_AVAILABLE)
    offsets_partition = (OFFSETS_TOPIC, broker.group_coordinator.partition_for(req.group_id))
    coordinator.handle_add_partitions(req.transactional_id, req.producer_id, req.producer_epoch,
                                      [offsets_partition], respond)


def handle_end_txn(broker, ctx, req) -> None:
    """EndTxn v5 is a transaction version 2 client's (KIP-890 part 2): the coordinator
    bumps the epoch and the response carries the producer id and epoch to go on with."""
    v = ctx.api_version
    coordinator = _coordinator(broker)

    def respond(err: ErrorCode, producer_id: int = -1, producer_epoch: int = -1) -> None:
        ctx.respond(EndTxnResponse(throttle_time_ms=0, error_code=_fenced_for(v, err), producer_id=producer_id,
                                   producer_epoch=producer_epoch))

    auth = authz(broker, ctx)
    if auth is not None and not auth.allowed(WRITE, TRANSACTIONAL_ID, req.transactional_id):
        return respond(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if coordinator is None:
        return respond(E.COORDINATOR_NOT_AVAILABLE)
    coordinator.handle_end_transaction(req.transactional_id, req.producer_id, req.producer_epoch, req.committed,
                                       respond, TV2 if v >= 5 else 0, with_producer=True)


# -- TxnOffsetCommit ---------------------------------------------------------------------------------

def handle_txn_offset_commit(broker, ctx, req) -> None:
    from kbroker.coordinator.group.offsets import OffsetAndMetadata

    v = ctx.api_version
    group = broker.group_coordinator
    now = group.now_ms()
    order: list[tuple[str, list[int]]] = []
    errors: dict[tuple, ErrorCode] = {}
    offsets: dict[tuple, OffsetAndMetadata] = {}
    auth = authz(broker, ctx)
    # KafkaApis: WRITE on the transactional id, READ on the group, READ on each topic
    denied_all = None if auth is None else (
        E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED if not auth.allowed(WRITE, TRANSACTIONAL_ID, req.transactional_id)
        else E.GROUP_AUTHORIZATION_FAILED if not auth.allowed(READ, GROUP, req.group_id) else None)
    for t in req.topics:
        order.append((t.name, [p.partition_index for p in t.partitions]))
        topic_denied = auth is not None and not auth.allowed(READ, TOPIC, t.name)
        for p in t.partitions:
            tp = (t.name, p.partition_index)
            if denied_all is not None or topic_denied:
                errors[tp] = denied_all if denied_all is not None else E.TOPIC_AUTHORIZATION_FAILED
                continue
            if not _partition_exists(broker, *tp):
                errors[tp] = E.UNKNOWN_TOPIC_OR_PARTITION
                continue
            offsets[tp] = OffsetAndMetadata(p.committed_offset, p.committed_leader_epoch if v >= 2 else -1,
                                            p.committed_metadata if p.committed_metadata is not None else "", now)

    def respond(result: dict) -> None:
        errors.update(result)
        out = []
        for name, parts in order:
            ps = []
            for i in parts:
                err = errors.get((name, i), E.NONE)
                if v < 2 and err == E.COORDINATOR_LOAD_IN_PROGRESS:
                    err = E.COORDINATOR_NOT_AVAILABLE
                ps.append(TxnOffsetCommitResponsePartition(partition_index=i, error_code=err))
            out.append(TxnOffsetCommitResponseTopic(name=name, partitions=ps))
        ctx.respond(TxnOffsetCommitResponse(throttle_time_ms=0, topics=out))

    if not offsets:
        return respond({})

    guard = None

    def commit() -> None:
        group.commit_transactional_offsets(
            req.group_id, req.producer_id, req.producer_epoch, req.member_id if v >= 3 else "",
            req.group_instance_id if v >= 3 else None, req.generation_id if v >= 3 else -1, offsets, respond,
            verification_guard=guard)

    coordinator = _coordinator(broker)
    verifier = getattr(getattr(broker, "replica_manager", None), "txn_verifier", None)
    add = v >= 5     # transaction version 2: the offsets partition is added here (no AddOffsetsToTxn)
    if coordinator is None or req.group_id is None or (verifier is not None and not verifier.enabled() and not add):
        # transaction.partition.verification.enable=false: no verification (Kafka's
        # ReplicaManager.maybeStartTransactionVerificationForPartition answers the sentinel)
        return commit()
    offsets_partition = (OFFSETS_TOPIC, group.partition_for(req.group_id))
    guard = txn_verification.start_coordinator_verification(broker, offsets_partition, req.producer_id,
                                                            req.producer_epoch)
    if guard is txn_verification.SENTINEL:  # the producer's transaction is open there: nothing to ask
        return commit()

    def verified(errors: dict) -> None:
        err = errors.get(offsets_partition, E.NONE)
        if err == E.NONE:
            return commit()
        if err == E.NETWORK_EXCEPTION:  # GroupMetadataManager.maybeConvertOffsetCommitError
            err = E.COORDINATOR_LOAD_IN_PROGRESS
        respond({tp: err for tp in offsets})

    if verifier is not None:  # the transactional id's coordinator may be another broker (KRaft)
        return verifier.verify(req.transactional_id, req.producer_id, req.producer_epoch, [offsets_partition],
                               verified, v >= 4, add=add)
    if add:
        return coordinator.handle_add_partitions(
            req.transactional_id, req.producer_id, req.producer_epoch, [offsets_partition],
            lambda err: verified({offsets_partition: txn_verification.map_coordinator_error(err, True)}), TV2)
    codes = coordinator.handle_verify_partitions(req.transactional_id, req.producer_id, req.producer_epoch,
                                                 [offsets_partition])
    verified({tp: txn_verification.map_coordinator_error(c, v >= 4) for tp, c in codes.items()})


# -- DescribeTransactions / ListTransactions ---------------------------------------------------------

def handle_describe_transactions(broker, ctx, req) -> None:
    coordinator = _coordinator(broker)
    states = []
    auth = authz(broker, ctx)
    for tid in req.transactional_ids:
        if auth is not None and not auth.allowed(DESCRIBE, TRANSACTIONAL_ID, tid):   # KafkaApis
            states.append(dt.TransactionState(error_code=E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                              transactional_id=tid, transaction_state="", topics=[]))
            continue
        if coordinator is None:
            states.append(dt.TransactionState(error_code=E.COORDINATOR_NOT_AVAILABLE, transactional_id=tid,
                                              transaction_state="", topics=[]))
            continue
        d = coordinator.describe_transaction(tid)
        topics: dict[str, list[int]] = {}
        for topic, p in d.partitions:
            topics.setdefault(topic, []).append(p)
        states.append(dt.TransactionState(
            error_code=d.error, transactional_id=tid, transaction_state=d.state,
            transaction_timeout_ms=d.timeout_ms, transaction_start_time_ms=d.start_time_ms,
            producer_id=d.producer_id, producer_epoch=d.producer_epoch,
            topics=[dt.TopicData(topic=t, partitions=ps) for t, ps in topics.items()]))
    ctx.respond(dt.DescribeTransactionsResponse(throttle_time_ms=0, transaction_states=states))


def handle_list_transactions(broker, ctx, req) -> None:
    coordinator = _coordinator(broker)
    if coordinator is None:
        ctx.respond(lt.ListTransactionsResponse(throttle_time_ms=0, error_code=E.COORDINATOR_NOT_AVAILABLE,
                                                unknown_state_filters=[], transaction_states=[]))
        return
    duration = req.duration_filter if ctx.api_version >= 1 else -1
    err, unknown, txns = coordinator.list_transactions(req.state_filters, req.producer_id_filters, duration)
    auth = authz(broker, ctx)
    if auth is not None:      # KafkaApis: only the transactional ids the principal may DESCRIBE
        txns = [t for t in txns if auth.allowed(DESCRIBE, TRANSACTIONAL_ID, t.transactional_id)]
    ctx.respond(lt.ListTransactionsResponse(
        throttle_time_ms=0, error_code=err, unknown_state_filters=unknown,
        transaction_states=[lt.TransactionState(transactional_id=t.transactional_id, producer_id=t.producer_id,
                                                transaction_state=t.state) for t in txns]))


HANDLERS = {
    ApiKey.ADD_PARTITIONS_TO_TXN: ApiHandler(0, 5, handle_add_partitions_to_txn),
    ApiKey.ADD_OFFSETS_TO_TXN: ApiHandler(0, 4, handle_add_offsets_to_txn),
    ApiKey.END_TXN: ApiHandler(0, 5, handle_end_txn),
    ApiKey.DESCRIBE_TRANSACTIONS: ApiHandler(0, 0, handle_describe_transactions),
    ApiKey.LIST_TRANSACTIONS: ApiHandler(0, 1, handle_list_transactions),
    #: a transactional batch to __consumer_offsets, visible once the COMMIT marker lands
    ApiKey.TXN_OFFSET_COMMIT: ApiHandler(0, 5, handle_txn_offset_commit),
}
