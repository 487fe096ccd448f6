"""ApiVersions: exactly the (api key, version range) pairs this broker implements, and
(v3+) its supported and finalized features (:mod:`kbroker.server.features`)."""
from __future__ import annotations

import re

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.api_versions import (
    ApiVersion, ApiVersionsResponse, FinalizedFeatureKey, SupportedFeatureKey,
)
from kbroker.server import features
from kbroker.server.apis import ApiHandler


def api_versions_response(apis, error_code: int = ErrorCode.NONE) -> ApiVersionsResponse:
    broker = getattr(apis, "broker", None)
    versions = apis.supported_versions()
    if broker is not None and hasattr(broker, "metadata"):
        versions = features.advertised_versions(broker, versions)
        finalized = features.finalized(broker)
        extra = dict(
            supported_features=[SupportedFeatureKey(name=n, min_version=lo, max_version=hi)
                                for n, (lo, hi) in sorted(features.SUPPORTED.items())],
            finalized_features_epoch=features.finalized_epoch(broker),
            finalized_features=[FinalizedFeatureKey(name=n, max_version_level=lv, min_version_level=lv)
                                for n, lv in sorted(finalized.items())])
    else:
        extra = {}
    return ApiVersionsResponse(
        error_code=error_code,
        api_keys=[ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, (lo, hi) in versions.items()],
        throttle_time_ms=0, **extra)


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
