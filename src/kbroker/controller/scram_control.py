"""ScramControlManager: the users' SCRAM credentials as UserScramCredentialRecords.

Kafka: ``controller/ScramControlManager``. Replicated state (changed only by ``replay``):
(user, mechanism type) -> ScramCredential (salt, stored key, server key, iterations; never
the password). AlterUserScramCredentials is validated as Kafka's controller does, one
result per user:

- a user named twice in one request (deletions and upsertions together, whatever the
  mechanisms) is DUPLICATE_RESOURCE "A user credential cannot be altered twice in the same
  request", and none of its alterations is applied;
- metadata.version below 3.5-IV2: UNSUPPORTED_VERSION;
- an empty user name: UNACCEPTABLE_CREDENTIAL "Username must not be empty"; a mechanism
  other than SCRAM-SHA-256 (1) / SCRAM-SHA-512 (2): UNSUPPORTED_SASL_MECHANISM "Unknown SCRAM
  mechanism";
- an upsertion's iterations below 4096 / above 16384: UNACCEPTABLE_CREDENTIAL "Too few
  iterations" / "Too many iterations";
- a deletion of a credential that does not exist: RESOURCE_NOT_FOUND "Attempt to delete a
  user credential that does not exist".

Each valid deletion writes a RemoveUserScramCredentialRecord and each valid upsertion a
UserScramCredentialRecord (stored and server keys derived here from the salted password the
client sent), all in one atomic batch. Results: the deletions, then the upsertions, then the
errors, each in request order (Kafka's come from hash maps; clients match them by user).
"""
from __future__ import annotations

from kbroker.controller.result import ControllerResult
from kbroker.metadata import records as R
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages.alter_user_scram_credentials import (
    AlterUserScramCredentialsResponse, AlterUserScramCredentialsResult,
)
from kbroker.security import scram

DUPLICATE = "A user credential cannot be altered twice in the same request"


class ScramControlManager:
    def __init__(self, features):
        self.features = features
        self.credentials: dict = {}       # (user, mechanism type) -> scram.ScramCredential

    def replay(self, r, offset: int) -> None:
        key = (r.name, r.mechanism)
        if type(r) is R.RemoveUserScramCredentialRecord:
            if self.credentials.pop(key, None) is None:
                raise ValueError("Unable to find credential to delete: %s/%d" % key)
            return
        self.credentials[key] = scram.ScramCredential(bytes(r.salt), bytes(r.stored_key), bytes(r.server_key),
                                                      r.iterations)

    @staticmethod
    def _validate_name_and_mechanism(name: str, mechanism: int):
        if not name:
            return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
        if mechanism not in scram.MECHANISM_BY_TYPE:
            return ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"
        return None

    def _validate_deletion(self, d):
        err = self._validate_name_and_mechanism(d.name, d.mechanism)
        if err is None and (d.name, d.mechanism) not in self.credentials:
            err = ErrorCode.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"
        return err

    def _validate_upsertion(self, u):
        err = self._validate_name_and_mechanism(u.name, u.mechanism)
        if err is None:
            if u.iterations < scram.MIN_ITERATIONS:
                err = ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations"
            elif u.iterations > scram.MAX_ITERATIONS:
                err = ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations"
        return err

    def alter_user_scram_credentials(self, req) -> ControllerResult:
        supported = self.features.scram_supported()
        deletions: dict = {}              # user -> deletion
        upsertions: dict = {}             # user -> upsertion
        errors: dict = {}                 # user -> (code, message)

        def consider(item, validate, into):
            name = item.name
            if name in errors:
                return
            if deletions.pop(name, None) is not None or upsertions.pop(name, None) is not None:
                errors[name] = (ErrorCode.DUPLICATE_RESOURCE, DUPLICATE)
            elif not supported:
                errors[name] = (ErrorCode.UNSUPPORTED_VERSION, "The current metadata.version does not support SCRAM")
            else:
                err = validate(item)
                if err is None:
                    into[name] = item
                else:
                    errors[name] = err

        for d in req.deletions or ():
            consider(d, self._validate_deletion, deletions)
        for u in req.upsertions or ():
            consider(u, self._validate_upsertion, upsertions)
        out = ControllerResult(atomic=True)
        results = []
        for d in deletions.values():
            out.add(R.RemoveUserScramCredentialRecord(name=d.name, mechanism=d.mechanism), 0)
            results.append(AlterUserScramCredentialsResult(user=d.name, error_code=ErrorCode.NONE,
                                                           error_message=None))
        for u in upsertions.values():
            c = scram.credential_from_salted(scram.MECHANISM_BY_TYPE[u.mechanism], bytes(u.salted_password),
                                             bytes(u.salt), u.iterations)
            out.add(R.UserScramCredentialRecord(name=u.name, mechanism=u.mechanism, salt=c.salt,
                                                stored_key=c.stored_key, server_key=c.server_key,
                                                iterations=c.iterations), 0)
            results.append(AlterUserScramCredentialsResult(user=u.name, error_code=ErrorCode.NONE,
                                                           error_message=None))
        for name, (code, message) in errors.items():
            results.append(AlterUserScramCredentialsResult(user=name, error_code=code, error_message=message))
        out.response = AlterUserScramCredentialsResponse(throttle_time_ms=0, results=results)
        return out
