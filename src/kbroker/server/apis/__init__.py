"""Request handlers, one module per API family (as tansu splits its broker).

Each module exposes ``HANDLERS: dict[ApiKey, ApiHandler]``. An ApiHandler names
the versions it implements (which ApiVersions advertises, so the advertised set
is exactly what is implemented) and a function ``handle(broker, ctx, body)``
that answers through ``ctx`` (see RequestContext), possibly later from another
thread.
"""
from __future__ import annotations

from typing import Callable, NamedTuple


class ApiHandler(NamedTuple):
    min_version: int
    max_version: int
    handle: Callable  # (broker, ctx: RequestContext, body) -> None
