"""Kafka protocol error codes (Kafka 3.9.0 ``clients/.../common/protocol/Errors.java``).

Every code Kafka 3.9 defines, -1 .. 127 (99 is POSITION_OUT_OF_RANGE; there are no gaps).
``retriable`` is true when Kafka's exception class for the code extends
``RetriableException``; ``message`` is Kafka's default exception message (None for NONE).
Transcribed from the 3.9.0 tag; codes are wire values and never change.
"""
from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """A Kafka error code. ``ErrorCode(3).name == "UNKNOWN_TOPIC_OR_PARTITION"``."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    REPLICA_NOT_AVAILABLE = 9
    MESSAGE_TOO_LARGE = 10
    STALE_CONTROLLER_EPOCH = 11
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    TRANSACTION_COORDINATOR_FENCED = 52
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    SECURITY_DISABLED = 54
    OPERATION_NOT_ATTEMPTED = 55
    KAFKA_STORAGE_ERROR = 56
    LOG_DIR_NOT_FOUND = 57
    SASL_AUTHENTICATION_FAILED = 58
    UNKNOWN_PRODUCER_ID = 59
    REASSIGNMENT_IN_PROGRESS = 60
    DELEGATION_TOKEN_AUTH_DISABLED = 61
    DELEGATION_TOKEN_NOT_FOUND = 62
    DELEGATION_TOKEN_OWNER_MISMATCH = 63
    DELEGATION_TOKEN_REQUEST_NOT_ALLOWED = 64
    DELEGATION_TOKEN_AUTHORIZATION_FAILED = 65
    DELEGATION_TOKEN_EXPIRED = 66
    INVALID_PRINCIPAL_TYPE = 67
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    LISTENER_NOT_FOUND = 72
    TOPIC_DELETION_DISABLED = 73
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNSUPPORTED_COMPRESSION_TYPE = 76
    STALE_BROKER_EPOCH = 77
    OFFSET_NOT_AVAILABLE = 78
    MEMBER_ID_REQUIRED = 79
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    NO_REASSIGNMENT_IN_PROGRESS = 85
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    INVALID_RECORD = 87
    UNSTABLE_OFFSET_COMMIT = 88
    THROTTLING_QUOTA_EXCEEDED = 89
    PRODUCER_FENCED = 90
    RESOURCE_NOT_FOUND = 91
    DUPLICATE_RESOURCE = 92
    UNACCEPTABLE_CREDENTIAL = 93
    INCONSISTENT_VOTER_SET = 94
    INVALID_UPDATE_VERSION = 95
    FEATURE_UPDATE_FAILED = 96
    PRINCIPAL_DESERIALIZATION_FAILURE = 97
    SNAPSHOT_NOT_FOUND = 98
    POSITION_OUT_OF_RANGE = 99
    UNKNOWN_TOPIC_ID = 100
    DUPLICATE_BROKER_REGISTRATION = 101
    BROKER_ID_NOT_REGISTERED = 102
    INCONSISTENT_TOPIC_ID = 103
    INCONSISTENT_CLUSTER_ID = 104
    TRANSACTIONAL_ID_NOT_FOUND = 105
    FETCH_SESSION_TOPIC_ID_ERROR = 106
    INELIGIBLE_REPLICA = 107
    NEW_LEADER_ELECTED = 108
    OFFSET_MOVED_TO_TIERED_STORAGE = 109
    FENCED_MEMBER_EPOCH = 110
    UNRELEASED_INSTANCE_ID = 111
    UNSUPPORTED_ASSIGNOR = 112
    STALE_MEMBER_EPOCH = 113
    MISMATCHED_ENDPOINT_TYPE = 114
    UNSUPPORTED_ENDPOINT_TYPE = 115
    UNKNOWN_CONTROLLER_ID = 116
    UNKNOWN_SUBSCRIPTION_ID = 117
    TELEMETRY_TOO_LARGE = 118
    INVALID_REGISTRATION = 119
    TRANSACTION_ABORTABLE = 120
    INVALID_RECORD_STATE = 121
    SHARE_SESSION_NOT_FOUND = 122
    INVALID_SHARE_SESSION_EPOCH = 123
    FENCED_STATE_EPOCH = 124
    INVALID_VOTER_KEY = 125
    DUPLICATE_VOTER = 126
    VOTER_NOT_FOUND = 127

    @property
    def retriable(self) -> bool:
        """Whether a client may retry (Kafka: the exception extends RetriableException)."""
        return _INFO[self][0]

    @property
    def message(self) -> str | None:
        """Kafka's default message for this error."""
        return _INFO[self][1]

    @property
    def exception_name(self) -> str | None:
        """Name of Kafka's Java exception class for this code (None for NONE)."""
        return _INFO[self][2]


# code -> (retriable, message, Kafka exception class)
_INFO: dict[int, tuple[bool, str | None, str | None]] = {
    -1: (False, 'The server experienced an unexpected error when processing the request.', 'UnknownServerException'),
    0: (False, None, None),
    1: (False, 'The requested offset is not within the range of offsets maintained by the server.', 'OffsetOutOfRangeException'),
    2: (True, 'This message has failed its CRC checksum, exceeds the valid size, has a null key for a compacted topic, or is otherwise corrupt.', 'CorruptRecordException'),
    3: (True, 'This server does not host this topic-partition.', 'UnknownTopicOrPartitionException'),
    4: (False, 'The requested fetch size is invalid.', 'InvalidFetchSizeException'),
    5: (True, 'There is no leader for this topic-partition as we are in the middle of a leadership election.', 'LeaderNotAvailableException'),
    6: (True, 'For requests intended only for the leader, this error indicates that the broker is not the current leader. For requests intended for any replica, this error indicates that the broker is not a replica of the topic partition.', 'NotLeaderOrFollowerException'),
    7: (True, 'The request timed out.', 'TimeoutException'),
    8: (False, 'The broker is not available.', 'BrokerNotAvailableException'),
    9: (True, 'The replica is not available for the requested topic-partition. Produce/Fetch requests and other requests intended only for the leader or follower return NOT_LEADER_OR_FOLLOWER if the broker is not a replica of the topic-partition.', 'ReplicaNotAvailableException'),
    10: (False, 'The request included a message larger than the max message size the server will accept.', 'RecordTooLargeException'),
    11: (False, 'The controller moved to another broker.', 'ControllerMovedException'),
    12: (False, 'The metadata field of the offset request was too large.', 'OffsetMetadataTooLarge'),
    13: (True, 'The server disconnected before a response was received.', 'NetworkException'),
    14: (True, "The coordinator is loading and hence can't process requests.", 'CoordinatorLoadInProgressException'),
    15: (True, 'The coordinator is not available.', 'CoordinatorNotAvailableException'),
    16: (True, 'This is not the correct coordinator.', 'NotCoordinatorException'),
    17: (False, 'The request attempted to perform an operation on an invalid topic.', 'InvalidTopicException'),
    18: (False, 'The request included message batch larger than the configured segment size on the server.', 'RecordBatchTooLargeException'),
    19: (True, 'Messages are rejected since there are fewer in-sync replicas than required.', 'NotEnoughReplicasException'),
    20: (True, 'Messages are written to the log, but to fewer in-sync replicas than required.', 'NotEnoughReplicasAfterAppendException'),
    21: (False, 'Produce request specified an invalid value for required acks.', 'InvalidRequiredAcksException'),
    22: (False, 'Specified group generation id is not valid.', 'IllegalGenerationException'),
    23: (False, "The group member's supported protocols are incompatible with those of existing members or first group member tried to join with empty protocol type or empty protocol list.", 'InconsistentGroupProtocolException'),
    24: (False, 'The configured groupId is invalid.', 'InvalidGroupIdException'),
    25: (False, 'The coordinator is not aware of this member.', 'UnknownMemberIdException'),
    26: (False, 'The session timeout is not within the range allowed by the broker (as configured by group.min.session.timeout.ms and group.max.session.timeout.ms).', 'InvalidSessionTimeoutException'),
    27: (False, 'The group is rebalancing, so a rejoin is needed.', 'RebalanceInProgressException'),
    28: (False, 'The committing offset data size is not valid.', 'InvalidCommitOffsetSizeException'),
    29: (False, 'Topic authorization failed.', 'TopicAuthorizationException'),
    30: (False, 'Group authorization failed.', 'GroupAuthorizationException'),
    31: (False, 'Cluster authorization failed.', 'ClusterAuthorizationException'),
    32: (False, 'The timestamp of the message is out of acceptable range.', 'InvalidTimestampException'),
    33: (False, 'The broker does not support the requested SASL mechanism.', 'UnsupportedSaslMechanismException'),
    34: (False, 'Request is not valid given the current SASL state.', 'IllegalSaslStateException'),
    35: (False, 'The version of API is not supported.', 'UnsupportedVersionException'),
    36: (False, 'Topic with this name already exists.', 'TopicExistsException'),
    37: (False, 'Number of partitions is below 1.', 'InvalidPartitionsException'),
    38: (False, 'Replication factor is below 1 or larger than the number of available brokers.', 'InvalidReplicationFactorException'),
    39: (False, 'Replica assignment is invalid.', 'InvalidReplicaAssignmentException'),
    40: (False, 'Configuration is invalid.', 'InvalidConfigurationException'),
    41: (True, 'This is not the correct controller for this cluster.', 'NotControllerException'),
    42: (False, 'This most likely occurs because of a request being malformed by the client library or the message was sent to an incompatible broker. See the broker logs for more details.', 'InvalidRequestException'),
    43: (False, 'The message format version on the broker does not support the request.', 'UnsupportedForMessageFormatException'),
    44: (False, 'Request parameters do not satisfy the configured policy.', 'PolicyViolationException'),
    45: (False, 'The broker received an out of order sequence number.', 'OutOfOrderSequenceException'),
    46: (False, 'The broker received a duplicate sequence number.', 'DuplicateSequenceException'),
    47: (False, 'Producer attempted to produce with an old epoch.', 'InvalidProducerEpochException'),
    48: (False, 'The producer attempted a transactional operation in an invalid state.', 'InvalidTxnStateException'),
    49: (False, 'The producer attempted to use a producer id which is not currently assigned to its transactional id.', 'InvalidPidMappingException'),
    50: (False, 'The transaction timeout is larger than the maximum value allowed by the broker (as configured by transaction.max.timeout.ms).', 'InvalidTxnTimeoutException'),
    51: (True, 'The producer attempted to update a transaction while another concurrent operation on the same transaction was ongoing.', 'ConcurrentTransactionsException'),
    52: (False, 'Indicates that the transaction coordinator sending a WriteTxnMarker is no longer the current coordinator for a given producer.', 'TransactionCoordinatorFencedException'),
    53: (False, 'Transactional Id authorization failed.', 'TransactionalIdAuthorizationException'),
    54: (False, 'Security features are disabled.', 'SecurityDisabledException'),
    55: (False, 'The broker did not attempt to execute this operation. This may happen for batched RPCs where some operations in the batch failed, causing the broker to respond without trying the rest.', 'OperationNotAttemptedException'),
    56: (True, 'Disk error when trying to access log file on the disk.', 'KafkaStorageException'),
    57: (False, 'The user-specified log directory is not found in the broker config.', 'LogDirNotFoundException'),
    58: (False, 'SASL Authentication failed.', 'SaslAuthenticationException'),
    59: (False, "This exception is raised by the broker if it could not locate the producer metadata associated with the producerId in question. This could happen if, for instance, the producer's records were deleted because their retention time had elapsed. Once the last records of the producerId are removed, the producer's metadata is removed from the broker, and future appends by the producer will return this exception.", 'UnknownProducerIdException'),
    60: (False, 'A partition reassignment is in progress.', 'ReassignmentInProgressException'),
    61: (False, 'Delegation Token feature is not enabled.', 'DelegationTokenDisabledException'),
    62: (False, 'Delegation Token is not found on server.', 'DelegationTokenNotFoundException'),
    63: (False, 'Specified Principal is not valid Owner/Renewer.', 'DelegationTokenOwnerMismatchException'),
    64: (False, 'Delegation Token requests are not allowed on PLAINTEXT/1-way SSL channels and on delegation token authenticated channels.', 'UnsupportedByAuthenticationException'),
    65: (False, 'Delegation Token authorization failed.', 'DelegationTokenAuthorizationException'),
    66: (False, 'Delegation Token is expired.', 'DelegationTokenExpiredException'),
    67: (False, 'Supplied principalType is not supported.', 'InvalidPrincipalTypeException'),
    68: (False, 'The group is not empty.', 'GroupNotEmptyException'),
    69: (False, 'The group id does not exist.', 'GroupIdNotFoundException'),
    70: (True, 'The fetch session ID was not found.', 'FetchSessionIdNotFoundException'),
    71: (True, 'The fetch session epoch is invalid.', 'InvalidFetchSessionEpochException'),
    72: (True, 'There is no listener on the leader broker that matches the listener on which metadata request was processed.', 'ListenerNotFoundException'),
    73: (False, 'Topic deletion is disabled.', 'TopicDeletionDisabledException'),
    74: (True, 'The leader epoch in the request is older than the epoch on the broker.', 'FencedLeaderEpochException'),
    75: (True, 'The leader epoch in the request is newer than the epoch on the broker.', 'UnknownLeaderEpochException'),
    76: (False, 'The requesting client does not support the compression type of given partition.', 'UnsupportedCompressionTypeException'),
    77: (False, 'Broker epoch has changed.', 'StaleBrokerEpochException'),
    78: (True, 'The leader high watermark has not caught up from a recent leader election so the offsets cannot be guaranteed to be monotonically increasing.', 'OffsetNotAvailableException'),
    79: (False, 'The group member needs to have a valid member id before actually entering a consumer group.', 'MemberIdRequiredException'),
    80: (True, 'The preferred leader was not available.', 'PreferredLeaderNotAvailableException'),
    81: (False, 'The consumer group has reached its max size.', 'GroupMaxSizeReachedException'),
    82: (False, 'The broker rejected this static consumer since another consumer with the same group.instance.id has registered with a different member.id.', 'FencedInstanceIdException'),
    83: (True, 'Eligible topic partition leaders are not available.', 'EligibleLeadersNotAvailableException'),
    84: (True, 'Leader election not needed for topic partition.', 'ElectionNotNeededException'),
    85: (False, 'No partition reassignment is in progress.', 'NoReassignmentInProgressException'),
    86: (False, 'Deleting offsets of a topic is forbidden while the consumer group is actively subscribed to it.', 'GroupSubscribedToTopicException'),
    87: (False, 'This record has failed the validation on broker and hence will be rejected.', 'InvalidRecordException'),
    88: (True, 'There are unstable offsets that need to be cleared.', 'UnstableOffsetCommitException'),
    89: (True, 'The throttling quota has been exceeded.', 'ThrottlingQuotaExceededException'),
    90: (False, 'There is a newer producer with the same transactionalId which fences the current one.', 'ProducerFencedException'),
    91: (False, 'A request illegally referred to a resource that does not exist.', 'ResourceNotFoundException'),
    92: (False, 'A request illegally referred to the same resource twice.', 'DuplicateResourceException'),
    93: (False, 'Requested credential would not meet criteria for acceptability.', 'UnacceptableCredentialException'),
    94: (False, 'Indicates that the either the sender or recipient of a voter-only request is not one of the expected voters.', 'InconsistentVoterSetException'),
    95: (False, 'The given update version was invalid.', 'InvalidUpdateVersionException'),
    96: (False, 'Unable to update finalized features due to an unexpected server error.', 'FeatureUpdateFailedException'),
    97: (False, 'Request principal deserialization failed during forwarding. This indicates an internal error on the broker cluster security setup.', 'PrincipalDeserializationException'),
    98: (False, 'Requested snapshot was not found.', 'SnapshotNotFoundException'),
    99: (False, 'Requested position is not greater than or equal to zero, and less than the size of the snapshot.', 'PositionOutOfRangeException'),
    100: (True, 'This server does not host this topic ID.', 'UnknownTopicIdException'),
    101: (False, 'This broker ID is already in use.', 'DuplicateBrokerRegistrationException'),
    102: (False, 'The given broker ID was not registered.', 'BrokerIdNotRegisteredException'),
    103: (True, "The log's topic ID did not match the topic ID in the request.", 'InconsistentTopicIdException'),
    104: (False, 'The clusterId in the request does not match that found on the server.', 'InconsistentClusterIdException'),
    105: (False, 'The transactionalId could not be found.', 'TransactionalIdNotFoundException'),
    106: (True, 'The fetch session encountered inconsistent topic ID usage.', 'FetchSessionTopicIdException'),
    107: (False, 'The new ISR contains at least one ineligible replica.', 'IneligibleReplicaException'),
    108: (False, 'The AlterPartition request successfully updated the partition state but the leader has changed.', 'NewLeaderElectedException'),
    109: (False, 'The requested offset is moved to tiered storage.', 'OffsetMovedToTieredStorageException'),
    110: (False, 'The member epoch is fenced by the group coordinator. The member must abandon all its partitions and rejoin.', 'FencedMemberEpochException'),
    111: (False, 'The instance ID is still used by another member in the consumer group. That member must leave first.', 'UnreleasedInstanceIdException'),
    112: (False, 'The assignor or its version range is not supported by the consumer group.', 'UnsupportedAssignorException'),
    113: (False, 'The member epoch is stale. The member must retry after receiving its updated member epoch via the ConsumerGroupHeartbeat API.', 'StaleMemberEpochException'),
    114: (False, 'The request was sent to an endpoint of the wrong type.', 'MismatchedEndpointTypeException'),
    115: (False, 'This endpoint type is not supported yet.', 'UnsupportedEndpointTypeException'),
    116: (False, 'This controller ID is not known.', 'UnknownControllerIdException'),
    117: (False, 'Client sent a push telemetry request with an invalid or outdated subscription ID.', 'UnknownSubscriptionIdException'),
    118: (False, 'Client sent a push telemetry request larger than the maximum size the broker will accept.', 'TelemetryTooLargeException'),
    119: (False, 'The controller has considered the broker registration to be invalid.', 'InvalidRegistrationException'),
    120: (False, 'The server encountered an error with the transaction. The client can abort the transaction to continue using this transactional ID.', 'TransactionAbortableException'),
    121: (False, 'The record state is invalid. The acknowledgement of delivery could not be completed.', 'InvalidRecordStateException'),
    122: (True, 'The share session was not found.', 'ShareSessionNotFoundException'),
    123: (True, 'The share session epoch is invalid.', 'InvalidShareSessionEpochException'),
    124: (False, 'The share coordinator rejected the request because the share-group state epoch did not match.', 'FencedStateEpochException'),
    125: (False, "The voter key doesn't match the receiving replica's key.", 'InvalidVoterKeyException'),
    126: (False, 'The voter is already part of the set of voters.', 'DuplicateVoterException'),
    127: (False, 'The voter is not part of the set of voters.', 'VoterNotFoundException'),
}


def error_code(code: int) -> ErrorCode:
    """The ErrorCode for a wire value; unknown codes map to UNKNOWN_SERVER_ERROR, as
    Kafka's ``Errors.forCode`` does."""
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR
