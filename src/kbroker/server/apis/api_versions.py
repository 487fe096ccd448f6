"""ApiVersions: exactly the (api key, version range) pairs this broker implements."""
from __future__ import annotations

import re

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.api_versions import ApiVersion, ApiVersionsResponse
from kbroker.server.apis import ApiHandler


def api_versions_response(apis, error_code: int = ErrorCode.NONE) -> ApiVersionsResponse:
    return ApiVersionsResponse(
        error_code=error_code,
        api_keys=[ApiVersion(api_key=k, min_version=lo, max_version=hi)
                  for k, (lo, hi) in apis.supported_versions().items()],
        throttle_time_ms=0,
    )


#: Kafka's ApiVersionsRequest.isValid pattern for client software name and version
_SOFTWARE_NAME_VERSION = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?$")


def handle_api_versions(broker, ctx, req) -> None:
    if ctx.api_version >= 3:
        name, version = req.client_software_name, req.client_software_version
        if not _SOFTWARE_NAME_VERSION.match(name or "") or not _SOFTWARE_NAME_VERSION.match(version or ""):
            ctx.respond(ApiVersionsResponse(error_code=ErrorCode.INVALID_REQUEST))
            return
    ctx.respond(api_versions_response(broker.apis))


HANDLERS = {ApiKey.API_VERSIONS: ApiHandler(0, 4, handle_api_versions)}
