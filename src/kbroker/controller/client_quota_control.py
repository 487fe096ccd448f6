"""ClientQuotaControlManager: client quotas in the metadata log.

Kafka: ``controller/ClientQuotaControlManager``. Replicated state (changed only by
``replay`` of ClientQuotaRecord): entity key ((type, name | None), ...) -> {quota key:
value}. AlterClientQuotas is validated with kbroker.quota.entity's rules (Kafka's); the
accepted changes of every valid entity become one atomic batch of records (a value that
does not change writes nothing; a removal of a key the entity does not have writes
nothing). ``validate_only`` writes nothing.
"""
from __future__ import annotations

from kbroker.controller.result import ControllerResult
from kbroker.metadata import records as R
from kbroker.protocol.messages import alter_client_quotas as acq
from kbroker.quota import entity as Q


class ClientQuotaControlManager:
    def __init__(self):
        self.data: dict = {}

    def replay(self, r, offset: int) -> None:
        key = Q.entity_key((e.entity_type, e.entity_name) for e in r.entity)
        quotas = self.data.setdefault(key, {})
        if r.remove:
            quotas.pop(r.key, None)
            if not quotas:
                del self.data[key]
        else:
            quotas[r.key] = r.value

    def alter_client_quotas(self, req) -> ControllerResult:
        results, changes = Q.plan_alterations(
            self.data, [([(e.entity_type, e.entity_name) for e in entry.entity],
                          [(op.key, op.value, op.remove) for op in entry.ops]) for entry in req.entries])
        out = ControllerResult(atomic=True)
        if not req.validate_only:
            for key, qkey, value in changes:
                ent = [R.client_quota_record.EntityData(entity_type=t, entity_name=n) for t, n in key]
                if value is None:
                    out.add(R.ClientQuotaRecord(entity=ent, key=qkey, value=0.0, remove=True), 0)
                else:
                    out.add(R.ClientQuotaRecord(entity=ent, key=qkey, value=value, remove=False), 0)
        out.response = acq.AlterClientQuotasResponse(throttle_time_ms=0, entries=[
            acq.AlterClientQuotasResponseEntryData(
                error_code=code, error_message=msg,
                entity=[acq.AlterClientQuotasResponseEntityData(entity_type=t, entity_name=n) for t, n in raw])
            for raw, code, msg in results])
        return out
