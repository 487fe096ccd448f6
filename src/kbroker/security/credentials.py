"""Where SCRAM credentials come from: a small interface the SASL servers read.

The zero-config broker's :class:`kbroker.server.metadata.MetadataStore` implements it (durable in
its metadata file). On a KRaft broker the credentials are the metadata image's
UserScramCredentialRecords (:class:`kbroker.metadata.image.ScramImage`, immutable): the broker's
metadata publisher hands each new one to a :class:`PublishedScramCredentials` (Kafka's
ScramPublisher feeding the CredentialProvider), which is what its SASL servers read. Readers call :meth:`ScramCredentialSource.scram_credential` on a
request handler thread for each authentication; implementations answer from an immutable
snapshot (no lock held by the caller).
"""
from __future__ import annotations

from typing import Mapping, Optional, Protocol

from kbroker.security.scram import ScramCredential


class ScramCredentialSource(Protocol):
    def scram_credential(self, user: str, mechanism: str) -> Optional[ScramCredential]:
        """The user's credential for ``mechanism`` (``SCRAM-SHA-256`` / ``SCRAM-SHA-512``), or None."""


class ScramCredentialStore(ScramCredentialSource, Protocol):
    def scram_credentials(self) -> Mapping[str, Mapping[str, ScramCredential]]:
        """Every user's credentials: {user: {mechanism: credential}} (a snapshot)."""

    def alter_scram_credentials(self, upsertions: Mapping[tuple[str, str], ScramCredential],
                                deletions: list[tuple[str, str]]) -> None:
        """Apply all changes at once, durably, before returning; (user, mechanism) keys."""


class InMemoryScramCredentials:
    """A ScramCredentialStore in a dict (tests, and brokers without a metadata store)."""

    def __init__(self, credentials: Mapping[str, Mapping[str, ScramCredential]] | None = None):
        self._creds = {u: dict(m) for u, m in (credentials or {}).items()}

    def scram_credential(self, user: str, mechanism: str) -> Optional[ScramCredential]:
        return self._creds.get(user, {}).get(mechanism)

    def scram_credentials(self):
        return {u: dict(m) for u, m in self._creds.items()}

    def alter_scram_credentials(self, upsertions, deletions) -> None:
        creds = {u: dict(m) for u, m in self._creds.items()}
        for (user, mech) in deletions:
            creds.get(user, {}).pop(mech, None)
        for (user, mech), cred in upsertions.items():
            creds.setdefault(user, {})[mech] = cred
        self._creds = {u: m for u, m in creds.items() if m}


class PublishedScramCredentials:
    """A read-only ScramCredentialSource over an immutable snapshot (a ScramImage) that one
    publisher replaces with ``update``; readers take the current reference, never a lock.
    Empty (no user) until the first update."""

    def __init__(self, snapshot: ScramCredentialSource | None = None):
        self._snapshot = snapshot

    def update(self, snapshot: ScramCredentialSource) -> None:
        self._snapshot = snapshot

    def scram_credential(self, user: str, mechanism: str) -> Optional[ScramCredential]:
        snap = self._snapshot
        return None if snap is None else snap.scram_credential(user, mechanism)

    def scram_credentials(self) -> Mapping[str, Mapping[str, ScramCredential]]:
        snap = self._snapshot
        return {} if snap is None else snap.scram_credentials()
