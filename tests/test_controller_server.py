"""ControllerServer: controller listeners route only the controller's APIs."""
from __future__ import annotations

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import describe_quorum as DQ
from kbroker.protocol.messages import metadata as M
from kbroker.server.apis import ApiHandler
from kbroker.server.config import KafkaConfig
from kbroker.server.controller_server import ControllerServer
from tests.broker.raw_client import RawClient


class _Quorum:
    leader_id = 3


def _describe_quorum(target, ctx, req):
    ctx.respond(DQ.DescribeQuorumResponse(error_code=ErrorCode.NONE if target.leader_id == 3
                                          else ErrorCode.NOT_LEADER_OR_FOLLOWER))


def test_controller_listener_serves_only_its_apis():
    cfg = KafkaConfig({"num.io.threads": 1, "num.network.threads": 1})
    server = ControllerServer(cfg, ["CONTROLLER://127.0.0.1:0"],
                              {ApiKey.DESCRIBE_QUORUM: ApiHandler(0, 2, _describe_quorum)}, target=_Quorum())
    server.startup()
    try:
        port = server.bound_port("CONTROLLER")
        with RawClient(port) as c:
            keys = {k.api_key: (k.min_version, k.max_version) for k in c.api_versions().api_keys}
            # (SaslHandshake / SaslAuthenticate too, as Kafka's controllers list them)
            assert keys == {int(ApiKey.API_VERSIONS): (0, 4), int(ApiKey.DESCRIBE_QUORUM): (0, 2),
                            int(ApiKey.SASL_HANDSHAKE): (0, 1), int(ApiKey.SASL_AUTHENTICATE): (0, 2)}
            r = c.call(ApiKey.DESCRIBE_QUORUM, 2, DQ.DescribeQuorumRequest(topics=[]))
            assert r.error_code == ErrorCode.NONE
            # a client API is not enabled on a controller listener: the connection closes
            c.send(ApiKey.METADATA, 12, M.MetadataRequest(topics=None))
            assert c.is_closed_by_peer()
        with RawClient(port) as c:   # other connections are unaffected
            assert c.call(ApiKey.DESCRIBE_QUORUM, 1, DQ.DescribeQuorumRequest(topics=[])).error_code == 0
    finally:
        server.shutdown()
