"""IncrementalAlterConfigs / AlterConfigs / DescribeConfigs, AllocateProducerIds, features."""
from __future__ import annotations

from kbroker.controller import ApiError
from kbroker.controller.features import IBP_3_3_IV0, LATEST, FeatureControlManager, bootstrap_records
from kbroker.metadata.image import BROKER_RESOURCE, TOPIC_RESOURCE
from kbroker.protocol.errors import ErrorCode as E
from kbroker.protocol.messages import alter_configs as AC
from kbroker.protocol.messages import describe_configs as DC
from kbroker.protocol.messages import incremental_alter_configs as IAC
from kbroker.protocol.messages.allocate_producer_ids import AllocateProducerIdsRequest

from tests.controller.harness import Harness


def incremental(h, rtype, name, ops, validate_only=False):
    req = IAC.IncrementalAlterConfigsRequest(validate_only=validate_only, resources=[IAC.AlterConfigsResource(
        resource_type=rtype, resource_name=name,
        configs=[IAC.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops])])
    r = h.write(h.c.incremental_alter_configs(req))
    return r.response.responses[0]


def describe(h, rtype, name, keys=None):
    req = DC.DescribeConfigsRequest(resources=[DC.DescribeConfigsResource(resource_type=rtype, resource_name=name,
                                                                           configuration_keys=keys)])
    return h.c.describe_configs(req).results[0]


def test_incremental_alter_topic_configs():
    h = Harness()
    h.start_brokers([1])
    h.create_topic("t", 1, 1)
    assert incremental(h, TOPIC_RESOURCE, "t", [("retention.ms", 0, "100"), ("cleanup.policy", 0, "delete")]) \
        .error_code == 0
    assert incremental(h, TOPIC_RESOURCE, "t", [("cleanup.policy", 2, "compact")]).error_code == 0
    assert h.broker_image().topic_configs("t") == {"retention.ms": "100", "cleanup.policy": "delete,compact"}
    assert incremental(h, TOPIC_RESOURCE, "t", [("cleanup.policy", 3, "delete"), ("retention.ms", 1, None)]) \
        .error_code == 0
    assert h.broker_image().topic_configs("t") == {"cleanup.policy": "compact"}
    n = len(h.log)
    assert incremental(h, TOPIC_RESOURCE, "t", [("cleanup.policy", 0, "compact")]).error_code == 0
    assert len(h.log) == n        # no change, no record
    assert incremental(h, TOPIC_RESOURCE, "t", [("retention.ms", 2, "1")]).error_code == E.INVALID_CONFIG
    assert incremental(h, TOPIC_RESOURCE, "t", [("a", 0, "1"), ("a", 1, None)]).error_code == E.INVALID_REQUEST
    assert incremental(h, TOPIC_RESOURCE, "nope", [("a", 0, "1")]).error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    assert incremental(h, TOPIC_RESOURCE, "t", [("x", 0, "1")], validate_only=True).error_code == 0
    assert len(h.log) == n
    d = describe(h, TOPIC_RESOURCE, "t")
    assert [(c.name, c.value, c.config_source) for c in d.configs] == [("cleanup.policy", "compact", 1)]


def test_broker_configs_and_validator():
    def validator(rtype, name, configs):
        if configs.get("log.cleaner.threads") == "0":
            raise ApiError(E.INVALID_CONFIG, "must be at least 1")
    h = Harness(config_validator=validator)
    h.start_brokers([1])
    assert incremental(h, BROKER_RESOURCE, "", [("log.cleaner.threads", 0, "2")]).error_code == 0
    assert incremental(h, BROKER_RESOURCE, "1", [("log.cleaner.threads", 0, "3")]).error_code == 0
    r = incremental(h, BROKER_RESOURCE, "1", [("log.cleaner.threads", 0, "0")])
    assert r.error_code == E.INVALID_CONFIG and r.error_message == "must be at least 1"
    assert incremental(h, BROKER_RESOURCE, "x", [("a", 0, "1")]).error_code == E.INVALID_REQUEST
    assert incremental(h, BROKER_RESOURCE, "9", [("a", 0, "1")]).error_code == E.BROKER_ID_NOT_REGISTERED
    assert incremental(h, 8, "1", [("a", 0, "1")]).error_code == E.INVALID_REQUEST
    img = h.broker_image()
    assert img.broker_configs == {"": {"log.cleaner.threads": "2"}, "1": {"log.cleaner.threads": "3"}}
    assert describe(h, BROKER_RESOURCE, "").configs[0].config_source == 4
    assert describe(h, BROKER_RESOURCE, "1", keys=["nope"]).configs == []


def test_legacy_alter_configs_replaces_the_set():
    h = Harness()
    h.start_brokers([1])
    h.create_topic("t", 1, 1, configs={"retention.ms": "5", "segment.ms": "9"})
    req = AC.AlterConfigsRequest(resources=[AC.AlterConfigsResource(resource_type=TOPIC_RESOURCE, resource_name="t",
                                                                    configs=[AC.AlterableConfig(name="segment.ms",
                                                                                                value="10")])])
    assert h.write(h.c.alter_configs(req)).response.responses[0].error_code == 0
    assert h.broker_image().topic_configs("t") == {"segment.ms": "10"}
    assert h.c.state() == h.replayed().state()


def test_allocate_producer_ids_blocks_are_disjoint():
    h = Harness()
    h.start_brokers([1, 2])
    seen = []
    for i in range(6):
        b = 1 + i % 2
        r = h.write(h.c.allocate_producer_ids(AllocateProducerIdsRequest(broker_id=b, broker_epoch=h.epochs[b])))
        assert r.response.error_code == 0 and r.response.producer_id_len == 1000
        seen.append(r.response.producer_id_start)
    assert seen == [0, 1000, 2000, 3000, 4000, 5000]
    r = h.write(h.c.allocate_producer_ids(AllocateProducerIdsRequest(broker_id=1, broker_epoch=h.epochs[1] + 1)))
    assert r.response.error_code == E.STALE_BROKER_EPOCH and not r.records
    assert h.broker_image().producer_ids.next_producer_id == 6000
    assert h.replayed().producer_ids.next_producer_id == 6000


def test_features_and_bootstrap():
    f = FeatureControlManager()
    assert f.metadata_version == 1
    for r in bootstrap_records(IBP_3_3_IV0):
        f.replay(r.message)
    assert f.metadata_version == IBP_3_3_IV0 and not f.directory_assignment() and f.register_broker_record_version() == 0
    for r in bootstrap_records(LATEST):
        f.replay(r.message)
    assert f.directory_assignment() and f.register_broker_record_version() == 3 and f.partition_record_version() == 1
    h = Harness()
    assert h.broker_image().features.metadata_version == LATEST
