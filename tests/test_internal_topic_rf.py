"""The replication factor a KRaft broker asks the controller for when it creates
__consumer_offsets / __transaction_state (ForwardingTopicManager): the setting, enforced
when set explicitly or once that many brokers are registered (fenced ones count); only
the default, on a cluster with fewer registered brokers, is clamped to them."""
import types

from kbroker.server.kraft_broker import ForwardingTopicManager

KEY = "offsets.topic.replication.factor"


class _Config(dict):
    """KafkaConfig's two views: values (with defaults) and the settings given (``originals``)."""

    def __init__(self, values, originals):
        super().__init__(values)
        self.originals = originals


def _rf(registered: int, props: dict) -> int:
    cache = types.SimpleNamespace(kraft_image=types.SimpleNamespace(
        cluster=types.SimpleNamespace(brokers={i: object() for i in range(registered)})))
    broker = types.SimpleNamespace(config=_Config({KEY: 3, **props}, originals=props), metadata_cache=cache)
    return ForwardingTopicManager(broker).internal_topic_replication_factor(KEY, "__consumer_offsets")


def test_enforced_once_enough_brokers_are_registered_clamped_only_below():
    assert _rf(3, {}) == 3          # one of them may be down: a replica is placed on it all the same
    assert _rf(5, {}) == 3
    assert _rf(2, {}) == 2          # a development cluster with fewer brokers than the default
    assert _rf(2, {KEY: 3}) == 3    # set explicitly: the controller refuses, FindCoordinator retries
