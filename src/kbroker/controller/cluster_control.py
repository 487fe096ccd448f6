"""ClusterControlManager and BrokerHeartbeatManager: broker registrations, sessions,
fencing and controlled shutdown.

Kafka: ``controller/ClusterControlManager``, ``BrokerHeartbeatManager``. Replicated
state (changed only by ``replay``): each broker's registration and the offset of the
RegisterBrokerRecord that created it — that offset IS the broker epoch. Soft state
(active controller only, rebuilt by ``activate``): each broker's session (last
heartbeat time, the metadata offset it reported, its controlled-shutdown offset).

A broker moves FENCED → UNFENCED when a heartbeat reports a metadata offset at or past
its registration record and it did not ask to stay fenced; UNFENCED → FENCED when its
session (``session_timeout_ms`` since the last heartbeat) expires (``fence_stale_broker``) or it
asks; UNFENCED + want_shut_down → CONTROLLED_SHUTDOWN while it still leads partitions
(the heartbeat moves its leaderships away), then SHUTDOWN_NOW once it leads nothing and
every active broker has seen that (lowest active metadata offset ≥ the offset of its
controlled-shutdown records). A broker fenced after a controlled shutdown stays fenced
until it registers again (a new incarnation). Fencing, controlled shutdown and unregistration all
remove the broker from every ISR and elect new leaders (ReplicationControlManager).
"""
from __future__ import annotations

from dataclasses import dataclass

from kbroker.controller.result import ApiError, ControllerResult
from kbroker.metadata import records as R
from kbroker.metadata.image import METADATA_VERSION, BrokerRegistration
from kbroker.protocol.errors import ErrorCode

FENCED, UNFENCED, CONTROLLED_SHUTDOWN, SHUTDOWN_NOW = "FENCED", "UNFENCED", "CONTROLLED_SHUTDOWN", "SHUTDOWN_NOW"
_FENCED_STATES = (FENCED, SHUTDOWN_NOW)
INT64_MAX = 2**63 - 1


@dataclass
class BrokerSession:
    last_contact_ms: int
    metadata_offset: int = -1
    controlled_shutdown_offset: int = -1


@dataclass
class HeartbeatReply:
    is_caught_up: bool
    is_fenced: bool
    in_controlled_shutdown: bool
    should_shut_down: bool


class BrokerHeartbeatManager:
    """Sessions of the brokers (soft state of the active controller)."""

    def __init__(self, session_timeout_ms: int):
        self.session_timeout_ms = session_timeout_ms
        self.sessions: dict = {}

    def touch(self, broker_id: int, now_ms: int, metadata_offset: int | None = None) -> BrokerSession:
        s = self.sessions.get(broker_id)
        if s is None:
            s = self.sessions[broker_id] = BrokerSession(now_ms)
        s.last_contact_ms = now_ms
        if metadata_offset is not None:
            s.metadata_offset = metadata_offset
        return s

    def expired(self, broker_id: int, now_ms: int) -> bool:
        s = self.sessions.get(broker_id)
        return s is None or now_ms - s.last_contact_ms >= self.session_timeout_ms


class ClusterControlManager:
    def __init__(self, config, features):
        self.config = config
        self.features = features
        self.brokers: dict = {}                 # id -> BrokerRegistration
        self.registration_offsets: dict = {}    # id -> offset of its RegisterBrokerRecord
        self.heartbeats = BrokerHeartbeatManager(config.session_timeout_ms)
        self.replication = None                 # set by the QuorumController

    # --- replicated state ------------------------------------------------------------
    def replay(self, r, offset: int) -> None:
        t = type(r)
        if t is R.RegisterBrokerRecord:
            self.brokers[r.broker_id] = BrokerRegistration.from_record(r)
            self.registration_offsets[r.broker_id] = offset
        elif t is R.UnregisterBrokerRecord:
            self._get(r.broker_id, r.broker_epoch)
            del self.brokers[r.broker_id]
            del self.registration_offsets[r.broker_id]
            self.heartbeats.sessions.pop(r.broker_id, None)
        elif t is R.FenceBrokerRecord:
            self._set(self._get(r.id, r.epoch), fenced=True)
        elif t is R.UnfenceBrokerRecord:
            self._set(self._get(r.id, r.epoch), fenced=False)
        elif t is R.BrokerRegistrationChangeRecord:
            b = self._get(r.broker_id, r.broker_epoch)
            fenced = b.fenced if r.fenced == 0 else r.fenced == 1
            ics = b.in_controlled_shutdown or r.in_controlled_shutdown == 1
            dirs = tuple(sorted(r.log_dirs)) if r.log_dirs else b.directories
            self._set(b, fenced=fenced, in_controlled_shutdown=ics, directories=dirs)

    def _get(self, broker_id: int, epoch: int) -> BrokerRegistration:
        b = self.brokers.get(broker_id)
        if b is None or b.epoch != epoch:
            raise ValueError("no registration of broker %d at epoch %d" % (broker_id, epoch))
        return b

    def _set(self, b: BrokerRegistration, **changes) -> None:
        from dataclasses import replace
        self.brokers[b.id] = replace(b, **changes)

    # --- queries -----------------------------------------------------------------------
    def registration(self, broker_id: int):
        return self.brokers.get(broker_id)

    def is_active(self, broker_id: int) -> bool:
        b = self.brokers.get(broker_id)
        return b is not None and b.is_active

    def is_unfenced(self, broker_id: int) -> bool:
        b = self.brokers.get(broker_id)
        return b is not None and not b.fenced

    def check_broker_epoch(self, broker_id: int, epoch: int) -> None:
        b = self.brokers.get(broker_id)
        if b is None:
            raise ApiError(ErrorCode.STALE_BROKER_EPOCH, "No broker registration found for broker %d" % broker_id)
        if b.epoch != epoch:
            raise ApiError(ErrorCode.STALE_BROKER_EPOCH,
                           "Expected broker epoch %d, but got broker epoch %d" % (b.epoch, epoch))

    def usable_brokers(self):
        """Placement candidates: registered and not in controlled shutdown."""
        from kbroker.controller.placement import UsableBroker
        return [UsableBroker(b.id, b.rack, b.fenced) for b in self.brokers.values()
                if not b.in_controlled_shutdown]

    def has_valid_session(self, broker_id: int, now_ms: int) -> bool:
        b = self.brokers.get(broker_id)
        return b is not None and not b.fenced and not self.heartbeats.expired(broker_id, now_ms)

    def activate(self, now_ms: int) -> None:
        """Become active: every registered broker gets a fresh session from ``now_ms``."""
        self.heartbeats.sessions = {bid: BrokerSession(now_ms) for bid in self.brokers}

    # --- BrokerRegistration --------------------------------------------------------------
    def register_broker(self, req, next_offset: int, now_ms: int) -> ControllerResult:
        from kbroker.protocol.messages.broker_registration import BrokerRegistrationResponse
        try:
            return self._register(req, next_offset, now_ms)
        except ApiError as e:
            return ControllerResult([], BrokerRegistrationResponse(error_code=e.code, broker_epoch=-1))

    def _register(self, req, next_offset, now_ms) -> ControllerResult:
        from kbroker.protocol.messages.broker_registration import BrokerRegistrationResponse
        if req.cluster_id != self.config.cluster_id:
            raise ApiError(ErrorCode.INCONSISTENT_CLUSTER_ID, "Expected cluster ID %s, but got cluster ID %s"
                           % (self.config.cluster_id, req.cluster_id))
        bid = req.broker_id
        existing = self.brokers.get(bid)
        if existing is not None and self.has_valid_session(bid, now_ms) \
                and existing.incarnation_id != req.incarnation_id:
            raise ApiError(ErrorCode.DUPLICATE_BROKER_REGISTRATION, "Another broker is registered with that broker id.")
        if req.is_migrating_zk_broker:
            raise ApiError(ErrorCode.BROKER_ID_NOT_REGISTERED, "Controller does not support registering ZK brokers.")
        log_dirs = list(req.log_dirs or [])
        if self.features.directory_assignment():
            if not log_dirs:
                raise ApiError(ErrorCode.INVALID_REGISTRATION, "No directories specified in request")
            if any(d.int < 64 for d in log_dirs):
                raise ApiError(ErrorCode.INVALID_REGISTRATION, "Reserved directory ID in request")
            if len(set(log_dirs)) != len(log_dirs):
                raise ApiError(ErrorCode.INVALID_REGISTRATION, "Duplicate directory ID in request")
            for other in self.brokers.values():
                if other.id != bid and set(other.directories) & set(log_dirs):
                    raise ApiError(ErrorCode.INVALID_REGISTRATION, "Broker %d is already registered with "
                                   "directory %s" % (other.id, sorted(set(other.directories) & set(log_dirs))[0]))
        else:
            log_dirs = []
        features = {f.name: (f.min_supported_version, f.max_supported_version) for f in req.features}
        features.setdefault(METADATA_VERSION, (1, 1))
        for name, level in self.features.finalized.items():
            lo, hi = features.get(name, (0, 0))
            if level and not lo <= level <= hi:
                raise ApiError(ErrorCode.UNSUPPORTED_VERSION, "Unable to register because the broker does not "
                               "support finalized version %d of %s. The broker wants a version between %d and %d, "
                               "inclusive." % (level, name, lo, hi))
        result = ControllerResult(atomic=True)
        rec = R.RegisterBrokerRecord(
            broker_id=bid, incarnation_id=req.incarnation_id, rack=req.rack,
            end_points=[R.register_broker_record.BrokerEndpoint(name=l.name, host=l.host, port=l.port,
                                                             security_protocol=l.security_protocol)
                        for l in req.listeners],
            features=[R.register_broker_record.BrokerFeature(name=n, min_supported_version=lo, max_supported_version=hi)
                      for n, (lo, hi) in sorted(features.items())],
            log_dirs=log_dirs)
        if existing is not None and existing.incarnation_id == req.incarnation_id:
            rec.broker_epoch = existing.epoch          # an amended registration keeps its epoch
            rec.fenced = existing.fenced
            rec.in_controlled_shutdown = existing.in_controlled_shutdown
        else:
            if existing is not None and not existing.fenced:
                # A new incarnation whose predecessor's session lapsed but was not yet
                # fenced: fence the old one first so no partition keeps it as leader.
                self.replication.handle_broker_fenced(bid, result)
            rec.broker_epoch = next_offset + len(result.records)
            self.heartbeats.sessions.pop(bid, None)
        result.add(rec, self.features.register_broker_record_version())
        self.heartbeats.touch(bid, now_ms)
        result.response = BrokerRegistrationResponse(error_code=0, broker_epoch=rec.broker_epoch)
        return result

    # --- BrokerHeartbeat -------------------------------------------------------------
    def current_state(self, broker_id: int) -> str:
        b = self.brokers[broker_id]
        if b.fenced:
            return FENCED
        return CONTROLLED_SHUTDOWN if b.in_controlled_shutdown else UNFENCED

    def _next_state(self, bid, req, reg_offset) -> tuple:
        cur = self.current_state(bid)
        has_leaderships = self.replication.has_leaderships(bid)
        if cur == FENCED:
            if req.want_shut_down:
                return cur, SHUTDOWN_NOW
            if self.brokers[bid].in_controlled_shutdown:
                return cur, FENCED      # shut down: only a new registration brings it back
            if not req.want_fence and req.current_metadata_offset >= reg_offset:
                return cur, UNFENCED
            return cur, FENCED
        if cur == UNFENCED:
            if req.want_fence:
                return cur, SHUTDOWN_NOW if req.want_shut_down else FENCED
            if req.want_shut_down:
                return cur, CONTROLLED_SHUTDOWN if has_leaderships else SHUTDOWN_NOW
            return cur, UNFENCED
        # CONTROLLED_SHUTDOWN
        if has_leaderships:
            return cur, CONTROLLED_SHUTDOWN
        s = self.heartbeats.sessions.get(bid)
        cs_offset = s.controlled_shutdown_offset if s is not None else -1
        if cs_offset <= self.lowest_active_offset():
            return cur, SHUTDOWN_NOW
        return cur, CONTROLLED_SHUTDOWN

    def lowest_active_offset(self) -> int:
        offs = [s.metadata_offset for bid, s in self.heartbeats.sessions.items() if self.is_active(bid)]
        return min(offs) if offs else INT64_MAX

    def broker_heartbeat(self, req, next_offset: int, now_ms: int) -> ControllerResult:
        from kbroker.protocol.messages.broker_heartbeat import BrokerHeartbeatResponse
        bid = req.broker_id
        try:
            self.check_broker_epoch(bid, req.broker_epoch)
        except ApiError as e:
            return ControllerResult([], BrokerHeartbeatResponse(error_code=e.code))
        reg_offset = self.registration_offsets[bid]
        cur, nxt = self._next_state(bid, req, reg_offset)
        result = ControllerResult()
        if cur != nxt:
            if nxt in _FENCED_STATES and cur in _FENCED_STATES:
                pass                    # already fenced (Kafka writes the fence again)
            elif nxt in _FENCED_STATES:
                self.replication.handle_broker_fenced(bid, result)
            elif nxt == UNFENCED:
                self.replication.handle_broker_unfenced(bid, req.broker_epoch, result)
            elif nxt == CONTROLLED_SHUTDOWN:
                self.replication.handle_broker_in_controlled_shutdown(bid, req.broker_epoch, result)
        s = self.heartbeats.touch(bid, now_ms, req.current_metadata_offset)
        if nxt == CONTROLLED_SHUTDOWN and cur != CONTROLLED_SHUTDOWN:
            s.controlled_shutdown_offset = next_offset + len(result.records) - 1
        result.response = BrokerHeartbeatResponse(
            error_code=0, is_caught_up=req.current_metadata_offset >= reg_offset,
            is_fenced=nxt in _FENCED_STATES, should_shut_down=nxt == SHUTDOWN_NOW)
        return result

    def stale_brokers(self, now_ms: int) -> list:
        """Unfenced brokers whose session expired, by id."""
        return [bid for bid in sorted(self.brokers)
                if not self.brokers[bid].fenced and self.heartbeats.expired(bid, now_ms)]

    def fence_stale_broker(self, broker_id: int) -> ControllerResult:
        """Fence one broker whose session expired (Kafka's maybeFenceOneStaleBroker): one
        broker per result, so each result is computed from the state after the last."""
        result = ControllerResult()
        self.replication.handle_broker_fenced(broker_id, result)
        return result

    def next_session_expiry_ms(self):
        """When the next unfenced broker's session expires (None: no unfenced broker)."""
        times = [s.last_contact_ms + self.heartbeats.session_timeout_ms
                 for bid, s in self.heartbeats.sessions.items() if self.is_unfenced(bid)]
        return min(times) if times else None

    # --- UnregisterBroker ---------------------------------------------------------------
    def unregister_broker(self, req) -> ControllerResult:
        from kbroker.protocol.messages.unregister_broker import UnregisterBrokerResponse
        b = self.brokers.get(req.broker_id)
        if b is None:
            return ControllerResult([], UnregisterBrokerResponse(
                error_code=ErrorCode.BROKER_ID_NOT_REGISTERED,
                error_message="Broker ID %d is not currently registered" % req.broker_id))
        result = ControllerResult(atomic=True)
        self.replication.remove_broker_from_partitions(b.id, result)
        result.add(R.UnregisterBrokerRecord(broker_id=b.id, broker_epoch=b.epoch), 0)
        result.response = UnregisterBrokerResponse(error_code=0)
        return result
