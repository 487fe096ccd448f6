"""Client exceptions, named after Kafka's Java exceptions.

``KafkaError`` is the base. A broker error code becomes an instance of the subclass
generated for that code (``UnknownTopicOrPartitionError`` for UNKNOWN_TOPIC_OR_PARTITION,
...); every instance carries ``code`` (an ``ErrorCode``), ``name`` (Kafka's upper-case
error name, e.g. "NOT_LEADER_OR_FOLLOWER") and ``retriable``. Errors raised by the client
itself (timeouts, closed producer, bad config) have ``code`` None unless a Kafka code
fits (a client-side timeout is REQUEST_TIMED_OUT, as Kafka's TimeoutException).
"""
from __future__ import annotations

from kbroker.protocol import ErrorCode


class KafkaError(Exception):
    """Base class. ``code`` is an ErrorCode or None; ``retriable`` as Kafka defines it."""

    code: ErrorCode | None = None
    retriable = False

    def __init__(self, message: str | None = None, code: ErrorCode | None = None):
        if code is not None:
            self.code = ErrorCode(code)
            self.retriable = self.code.retriable
        if message is None:
            message = self.code.message if self.code is not None else ""
        self.message = message
        super().__init__(self.__str__())

    @property
    def name(self) -> str:
        return self.code.name if self.code is not None else type(self).__name__

    def __str__(self) -> str:
        if self.code is not None:
            return f"{self.code.name}: {self.message}" if self.message else self.code.name
        return self.message or type(self).__name__


class KafkaConfigError(KafkaError, ValueError):
    """A bad configuration value; the message names the key (Kafka's ConfigException)."""


class KafkaTimeoutError(KafkaError):
    """An operation did not complete within its time bound (Kafka's TimeoutException)."""

    code = ErrorCode.REQUEST_TIMED_OUT
    retriable = True


class BufferExhaustedError(KafkaTimeoutError):
    """buffer.memory stayed full for max.block.ms (Kafka's BufferExhaustedException)."""


class KafkaConnectionError(KafkaError):
    """The connection to a broker failed or was closed (Kafka's NetworkException)."""

    code = ErrorCode.NETWORK_EXCEPTION
    retriable = True


class IllegalStateError(KafkaError):
    """The client is closed, or the call does not fit its state (IllegalStateException)."""


class NoOffsetForPartitionError(KafkaError):
    """auto.offset.reset=none and the partition has no position (NoOffsetForPartitionException)."""


class CommitFailedError(KafkaError):
    """The group rebalanced before the commit (Kafka's CommitFailedException); the code
    says why (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS)."""


class RecordTooLargeError(KafkaError):
    """A record is larger than max.request.size or buffer.memory (RecordTooLargeException)."""

    code = ErrorCode.MESSAGE_TOO_LARGE


def _class_name(code: ErrorCode) -> str:
    base = "".join(w.capitalize() for w in code.name.split("_"))
    return base if base.endswith("Error") else base + "Error"


#: ErrorCode -> its KafkaError subclass
ERROR_CLASSES: dict[int, type[KafkaError]] = {}
for _code in ErrorCode:
    if _code is ErrorCode.NONE:
        continue
    if _code is ErrorCode.REQUEST_TIMED_OUT:
        _cls = KafkaTimeoutError
    elif _code is ErrorCode.NETWORK_EXCEPTION:
        _cls = KafkaConnectionError
    elif _code is ErrorCode.MESSAGE_TOO_LARGE:
        _cls = RecordTooLargeError
    else:
        _cls = type(_class_name(_code), (KafkaError,),
                    {"code": _code, "retriable": _code.retriable, "__module__": __name__,
                     "__doc__": f"Broker error {_code.name} ({int(_code)})."})
        globals()[_cls.__name__] = _cls
    ERROR_CLASSES[int(_code)] = _cls
del _code, _cls


def for_code(code: int, message: str | None = None) -> KafkaError:
    """The exception for broker error ``code`` (an unknown code maps to UNKNOWN_SERVER_ERROR)."""
    try:
        ec = ErrorCode(code)
    except ValueError:
        return ERROR_CLASSES[-1](f"unknown error code {code}" + (f": {message}" if message else ""),
                                 ErrorCode.UNKNOWN_SERVER_ERROR)
    return ERROR_CLASSES[int(ec)](message, ec)
