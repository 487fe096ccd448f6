"""InitProducerId (api key 22), v0-5: producer ids for idempotent producers.

Kafka: ``KafkaApis.handleInitProducerIdRequest``. The decision logic is
:func:`kbroker.server.init_producer_id.handle_init_producer_id`; ids come from
the broker's durable :class:`~kbroker.server.producer_id_manager.ProducerIdManager`
(``broker.producer_id_manager``), so an id is never handed out twice, also
across restarts.

* ``transactional_id`` null (idempotent producer, e.g. every kafka-python 3.x /
  librdkafka / aiokafka producer with idempotence on): a fresh producer id, epoch 0.
  A v3+ request carrying the producer's current (producer_id, producer_epoch)
  also gets a fresh id, as Kafka's blind accept does.
* a transactional id: after Kafka's request checks (INVALID_REQUEST for an
  empty id or a half-set producer id/epoch, INVALID_TRANSACTION_TIMEOUT), the
  transaction coordinator (``broker.transaction_coordinator``) answers: epoch
  bump, fencing (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH below v4),
  CONCURRENT_TRANSACTIONS while a transaction completes. A broker without one
  answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED: not COORDINATOR_NOT_AVAILABLE,
  which clients retry until their timeout (aiokafka's ``start()`` forever); error
  53 is fatal in librdkafka, kafka-python and aiokafka, so ``init_transactions``
  fails at once with a clear error.

With an authorizer (KafkaApis): WRITE on the transactional id (else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED); an idempotent producer needs IDEMPOTENT_WRITE on the
cluster or WRITE on at least one topic (Kafka 3.x, KIP-679; else CLUSTER_AUTHORIZATION_FAILED).
"""
from __future__ import annotations

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.init_producer_id import InitProducerIdResponse
from kbroker.server.apis import ApiHandler
from kbroker.server.authz import IDEMPOTENT_WRITE, TOPIC, TRANSACTIONAL_ID, WRITE, authz
from kbroker.server.init_producer_id import InitProducerIdResult, handle_init_producer_id


class _NoTransactionCoordinator:
    """Stands in for the transaction coordinator until there is one (see the module docstring)."""

    @staticmethod
    def handle_init_producer_id(transactional_id, transaction_timeout_ms, expected, callback) -> None:
        callback(InitProducerIdResult(int(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)))


_NO_TRANSACTION_COORDINATOR = _NoTransactionCoordinator()


def handle_init_producer_id_request(broker, ctx, req) -> None:
    v = ctx.api_version
    producer_id, producer_epoch = (req.producer_id, req.producer_epoch) if v >= 3 else (-1, -1)

    def respond(result: InitProducerIdResult) -> None:
        err = result.error_code
        if v < 4 and err == ErrorCode.PRODUCER_FENCED:
            err = int(ErrorCode.INVALID_PRODUCER_EPOCH)  # older clients do not know PRODUCER_FENCED
        ctx.respond(InitProducerIdResponse(throttle_time_ms=0, error_code=err,
                                           producer_id=result.producer_id, producer_epoch=result.producer_epoch))

    auth = authz(broker, ctx)
    if auth is not None:
        if req.transactional_id is not None:
            if not auth.allowed(WRITE, TRANSACTIONAL_ID, req.transactional_id):
                respond(InitProducerIdResult(int(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)))
                return
        elif not auth.cluster(IDEMPOTENT_WRITE) and not auth.by_resource_type(WRITE, TOPIC):
            respond(InitProducerIdResult(int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)))
            return
    result = handle_init_producer_id(
        broker.producer_id_manager.generate_producer_id, req.transactional_id, req.transaction_timeout_ms,
        producer_id, producer_epoch, transaction_max_timeout_ms=broker.config["transaction.max.timeout.ms"],
        transaction_coordinator=getattr(broker, "transaction_coordinator", None) or _NO_TRANSACTION_COORDINATOR,
        respond=respond)
    if result is not None:
        respond(result)


HANDLERS = {ApiKey.INIT_PRODUCER_ID: ApiHandler(0, 5, handle_init_producer_id_request)}
