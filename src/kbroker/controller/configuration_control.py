"""ConfigurationControlManager: dynamic TOPIC and BROKER configs.

Kafka: ``controller/ConfigurationControlManager``. Replicated state: for each
(resource type, resource name) the keys set on it (broker resource "" is the
cluster-wide default, "<id>" one broker). IncrementalAlterConfigs (SET, DELETE, APPEND,
SUBTRACT) and the legacy AlterConfigs (replace the whole set) become ConfigRecords —
one per key whose value changes, value None deleting it — after the resulting set
passes ``config.config_validator`` (a hook: the broker's topic/broker config checks).
DescribeConfigs answers from this state with the dynamic values only; the broker
adds static and default values.
"""
from __future__ import annotations

from kbroker.controller.result import ApiError, ControllerResult
from kbroker.metadata import records as R
from kbroker.metadata.image import BROKER_RESOURCE, TOPIC_RESOURCE
from kbroker.metadata.serde import ApiMessageAndVersion
from kbroker.protocol.errors import ErrorCode as E

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
#: keys of type LIST that APPEND / SUBTRACT apply to
LIST_KEYS = frozenset({"cleanup.policy", "leader.replication.throttled.replicas",
                       "follower.replication.throttled.replicas"})
#: DescribeConfigs config_source for dynamic values
DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG = 1, 2, 4


class ConfigurationControlManager:
    def __init__(self, config, cluster):
        self.config = config
        self.cluster = cluster
        self.replication = None       # set by the QuorumController (topic existence)
        self.data: dict = {}          # (type, name) -> {key: value}

    def replay(self, r, offset: int) -> None:
        key = (r.resource_type, r.resource_name)
        if r.value is None:
            kv = self.data.get(key)
            if kv is not None:
                kv.pop(r.name, None)
                if not kv:
                    del self.data[key]
        else:
            self.data.setdefault(key, {})[r.name] = r.value

    def delete_topic_configs(self, name: str) -> None:
        self.data.pop((TOPIC_RESOURCE, name), None)

    def get(self, resource_type: int, name: str) -> dict:
        return dict(self.data.get((resource_type, name), {}))

    # --- validation ---------------------------------------------------------------------------
    def _check_resource(self, rtype: int, name: str) -> None:
        if rtype == TOPIC_RESOURCE:
            if self.replication.topic_by_name(name) is None:
                raise ApiError(E.UNKNOWN_TOPIC_OR_PARTITION, "The topic '%s' does not exist." % name)
        elif rtype == BROKER_RESOURCE:
            if name == "":
                return
            try:
                bid = int(name)
            except ValueError:
                raise ApiError(E.INVALID_REQUEST, "Illegal non-integral BROKER resource type name %s" % name) from None
            if self.cluster.registration(bid) is None:
                raise ApiError(E.BROKER_ID_NOT_REGISTERED, "Broker ID %d is not currently registered" % bid)
        else:
            raise ApiError(E.INVALID_REQUEST, "Unsupported resource type %d" % rtype)

    def _records(self, rtype: int, name: str, new: dict) -> list:
        old = self.data.get((rtype, name), {})
        self.config.config_validator(rtype, name, dict(new))
        out = []
        for k in sorted(set(old) | set(new)):
            if old.get(k) != new.get(k):
                out.append(ApiMessageAndVersion(R.ConfigRecord(resource_type=rtype, resource_name=name, name=k,
                                                               value=new.get(k)), 0))
        return out

    def new_topic_config_records(self, name: str, pairs) -> tuple:
        """(ConfigRecords, resulting configs) for a topic being created with ``pairs``
        [(key, value)]; None values are skipped. ApiError on a duplicate or invalid key."""
        new = {}
        for k, v in pairs:
            if k in new:
                raise ApiError(E.INVALID_CONFIG, "Duplicate config key %s" % k)
            if v is not None:
                new[k] = v
        try:
            self.config.config_validator(TOPIC_RESOURCE, name, dict(new))
        except ApiError:
            raise
        except ValueError as e:
            raise ApiError(E.INVALID_CONFIG, str(e)) from None
        return [ApiMessageAndVersion(R.ConfigRecord(resource_type=TOPIC_RESOURCE, resource_name=name, name=k,
                                                    value=v), 0) for k, v in sorted(new.items())], new

    def _validated(self, fn):
        try:
            return fn()
        except ApiError:
            raise
        except ValueError as e:
            raise ApiError(E.INVALID_CONFIG, str(e)) from None

    # --- IncrementalAlterConfigs / AlterConfigs ------------------------------------------------
    def incremental_alter_configs(self, req) -> ControllerResult:
        from kbroker.protocol.messages import incremental_alter_configs as Resp
        result = ControllerResult()
        out = []
        for res in req.resources:
            r = Resp.AlterConfigsResourceResponse(error_code=0, resource_type=res.resource_type,
                                                  resource_name=res.resource_name)
            out.append(r)
            try:
                self._check_resource(res.resource_type, res.resource_name)
                new = self.get(res.resource_type, res.resource_name)
                names = [c.name for c in res.configs]
                if len(set(names)) != len(names):
                    raise ApiError(E.INVALID_REQUEST, "Error due to duplicate config keys")
                for c in res.configs:
                    op = c.config_operation
                    if op == SET:
                        if c.value is None:
                            raise ApiError(E.INVALID_REQUEST, "Null value not supported for : %s" % c.name)
                        new[c.name] = c.value
                    elif op == DELETE:
                        new.pop(c.name, None)
                    elif op in (APPEND, SUBTRACT):
                        if c.name not in LIST_KEYS:
                            raise ApiError(E.INVALID_CONFIG, "Can't %s to key %s because its type is not LIST."
                                           % ("APPEND" if op == APPEND else "SUBTRACT", c.name))
                        cur = [x for x in new.get(c.name, "").split(",") if x]
                        vals = [x.strip() for x in (c.value or "").split(",") if x.strip()]
                        if op == APPEND:
                            cur += [x for x in vals if x not in cur]
                        else:
                            cur = [x for x in cur if x not in vals]
                        if cur:
                            new[c.name] = ",".join(cur)
                        else:
                            new.pop(c.name, None)
                    else:
                        raise ApiError(E.INVALID_REQUEST, "Unknown operation type %d" % op)
                recs = self._validated(lambda: self._records(res.resource_type, res.resource_name, new))
            except ApiError as e:
                r.error_code, r.error_message = e.code, e.message
                continue
            if not req.validate_only:
                result.records.extend(recs)
        result.response = Resp.IncrementalAlterConfigsResponse(responses=out)
        return result

    def alter_configs(self, req) -> ControllerResult:
        """Legacy AlterConfigs: the resource's dynamic configs become exactly the request's."""
        from kbroker.protocol.messages import alter_configs as Resp
        result = ControllerResult()
        out = []
        for res in req.resources:
            r = Resp.AlterConfigsResourceResponse(error_code=0, resource_type=res.resource_type,
                                                  resource_name=res.resource_name)
            out.append(r)
            try:
                self._check_resource(res.resource_type, res.resource_name)
                names = [c.name for c in res.configs]
                if len(set(names)) != len(names):
                    raise ApiError(E.INVALID_REQUEST, "Error due to duplicate config keys")
                new = {c.name: c.value for c in res.configs if c.value is not None}
                recs = self._validated(lambda: self._records(res.resource_type, res.resource_name, new))
            except ApiError as e:
                r.error_code, r.error_message = e.code, e.message
                continue
            if not req.validate_only:
                result.records.extend(recs)
        result.response = Resp.AlterConfigsResponse(responses=out)
        return result

    # --- DescribeConfigs (read only) ------------------------------------------------------------
    def describe_configs(self, req):
        from kbroker.protocol.messages import describe_configs as Resp
        results = []
        for res in req.resources:
            r = Resp.DescribeConfigsResult(error_code=0, resource_type=res.resource_type,
                                           resource_name=res.resource_name, configs=[])
            results.append(r)
            try:
                self._check_resource(res.resource_type, res.resource_name)
            except ApiError as e:
                r.error_code, r.error_message = e.code, e.message
                continue
            source = (DYNAMIC_TOPIC_CONFIG if res.resource_type == TOPIC_RESOURCE else
                      DYNAMIC_DEFAULT_BROKER_CONFIG if res.resource_name == "" else DYNAMIC_BROKER_CONFIG)
            keys = res.configuration_keys
            for k, v in sorted(self.data.get((res.resource_type, res.resource_name), {}).items()):
                if keys is None or k in keys:
                    r.configs.append(Resp.DescribeConfigsResourceResult(
                        name=k, value=v, read_only=False, config_source=source, is_sensitive=False))
        return Resp.DescribeConfigsResponse(results=results)
