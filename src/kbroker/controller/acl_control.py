"""AclControlManager: the cluster's ACLs as AccessControlEntryRecords.

Kafka: ``controller/AclControlManager``. Replicated state: ACL id -> StandardAcl (``acls``).
CreateAcls validates each ACL (INVALID_REQUEST with Kafka's text) and writes one
AccessControlEntryRecord per ACL not already present, with a fresh random id; DeleteAcls
writes one RemoveAccessControlEntryRecord per ACL any filter matches (each ACL once). Both
results are atomic. The broker authorizes the request (ALTER on the cluster) before
forwarding it here, and every broker's authorizer reads the ACLs from its published image.
"""
from __future__ import annotations

import uuid

from kbroker.controller.result import ControllerResult
from kbroker.metadata import records as R
from kbroker.security import acl_api
from kbroker.security.authorizer import StandardAcl


class AclControlManager:
    def __init__(self, random):
        self.random = random
        self.acls: dict = {}            # uuid.UUID -> StandardAcl

    def replay(self, r, offset: int) -> None:
        if type(r) is R.RemoveAccessControlEntryRecord:
            if self.acls.pop(r.id, None) is None:
                raise ValueError("RemoveAccessControlEntryRecord for unknown acl id %s" % r.id)
            return
        self.acls[r.id] = StandardAcl(r.resource_type, r.resource_name, r.pattern_type, r.principal, r.host,
                                      r.operation, r.permission_type)

    def _new_id(self) -> uuid.UUID:
        while True:
            u = uuid.UUID(int=self.random.getrandbits(128), version=4)
            if u not in self.acls:
                return u

    def create_acls(self, req) -> ControllerResult:
        result = ControllerResult(atomic=True)

        def apply(acls) -> None:
            present = set(self.acls.values())
            for a in acls:
                if a in present:
                    continue
                present.add(a)
                result.add(R.AccessControlEntryRecord(
                    id=self._new_id(), resource_type=a.resource_type, resource_name=a.resource_name,
                    pattern_type=a.pattern_type, principal=a.principal, host=a.host, operation=a.operation,
                    permission_type=a.permission_type), 0)
        result.response = acl_api.create_acls(req, apply)
        return result

    def delete_acls(self, req) -> ControllerResult:
        result = ControllerResult(atomic=True)

        def apply(filters) -> list:
            matched, removed = [], set()
            for f in filters:
                hits = sorted((a, i) for i, a in self.acls.items() if f.matches(a))
                matched.append([a for a, _ in hits])
                for _, i in hits:
                    if i not in removed:
                        removed.add(i)
                        result.add(R.RemoveAccessControlEntryRecord(id=i), 0)
            return matched
        result.response = acl_api.delete_acls(req, apply)
        return result
