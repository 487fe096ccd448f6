"""CreateAcls / DescribeAcls / DeleteAcls bodies <-> ACLs and filters, and their answers.

Shared by the zero-config broker (``kbroker.server.apis.acls``: ACLs in its MetadataStore) and
the KRaft controller (``kbroker.controller.acl_control``: AccessControlEntryRecords). Kafka's
checks (AclApis, AclControlManager): an invalid ACL or filter is INVALID_REQUEST with Kafka's
text, per creation or per filter; the others still apply.
"""
from __future__ import annotations

from typing import Callable

from kbroker.protocol import ErrorCode
from kbroker.protocol.messages import create_acls as CA, delete_acls as DA, describe_acls as DSA
from kbroker.security.authorizer import AclFilter, AclIndex, InvalidAclError, StandardAcl, validate_new_acl

SECURITY_DISABLED_MESSAGE = "No Authorizer is configured."


def acl_of(c) -> StandardAcl:
    return StandardAcl(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal, c.host,
                       c.operation, c.permission_type)


def filter_of(f) -> AclFilter:
    """A DescribeAclsRequest or DeleteAclsFilter as an AclFilter."""
    return AclFilter(f.resource_type_filter, f.resource_name_filter, f.pattern_type_filter, f.principal_filter,
                     f.host_filter, f.operation, f.permission_type)


def create_acls(req, apply: Callable[[list], None]) -> CA.CreateAclsResponse:
    """Validate each creation, ``apply(valid ACLs)`` once, answer per creation."""
    results, valid = [], []
    for c in req.creations:
        acl = acl_of(c)
        try:
            validate_new_acl(acl)
        except InvalidAclError as e:
            results.append(CA.AclCreationResult(error_code=ErrorCode.INVALID_REQUEST, error_message=str(e)))
            continue
        valid.append(acl)
        results.append(CA.AclCreationResult(error_code=ErrorCode.NONE, error_message=None))
    if valid:
        apply(valid)
    return CA.CreateAclsResponse(throttle_time_ms=0, results=results)


def delete_acls(req, apply: Callable[[list], list]) -> DA.DeleteAclsResponse:
    """Validate each filter, ``apply(valid filters) -> [matched ACLs per filter]`` once, answer per filter."""
    filters, errors = [], {}
    for i, f in enumerate(req.filters):
        af = filter_of(f)
        try:
            af.validate()
        except InvalidAclError as e:
            errors[i] = str(e)
            continue
        filters.append(af)
    matched = iter(apply(filters) if filters else [])
    out = []
    for i in range(len(req.filters)):
        if i in errors:
            out.append(DA.DeleteAclsFilterResult(error_code=ErrorCode.INVALID_REQUEST, error_message=errors[i],
                                                  matching_acls=[]))
            continue
        out.append(DA.DeleteAclsFilterResult(error_code=ErrorCode.NONE, error_message=None, matching_acls=[
            DA.DeleteAclsMatchingAcl(error_code=ErrorCode.NONE, error_message=None, resource_type=a.resource_type,
                                     resource_name=a.resource_name, pattern_type=a.pattern_type,
                                     principal=a.principal, host=a.host, operation=a.operation,
                                     permission_type=a.permission_type) for a in next(matched)]))
    return DA.DeleteAclsResponse(throttle_time_ms=0, filter_results=out)


def describe_acls(req, index: AclIndex) -> DSA.DescribeAclsResponse:
    f = filter_of(req)
    try:
        f.validate()
    except InvalidAclError as e:
        return DSA.DescribeAclsResponse(throttle_time_ms=0, error_code=ErrorCode.INVALID_REQUEST,
                                        error_message=str(e), resources=[])
    by_resource: dict = {}
    for a in index.filter(f):
        by_resource.setdefault((a.resource_type, a.resource_name, a.pattern_type), []).append(
            DSA.AclDescription(principal=a.principal, host=a.host, operation=a.operation,
                               permission_type=a.permission_type))
    return DSA.DescribeAclsResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, resources=[
        DSA.DescribeAclsResource(resource_type=rt, resource_name=rn, pattern_type=pt, acls=acls)
        for (rt, rn, pt), acls in sorted(by_resource.items())])


def security_disabled(api: str, req):
    """The answer when no authorizer is configured (Kafka's SECURITY_DISABLED)."""
    code, msg = ErrorCode.SECURITY_DISABLED, SECURITY_DISABLED_MESSAGE
    if api == "create":
        return CA.CreateAclsResponse(throttle_time_ms=0, results=[
            CA.AclCreationResult(error_code=code, error_message=msg) for _ in req.creations])
    if api == "delete":
        return DA.DeleteAclsResponse(throttle_time_ms=0, filter_results=[
            DA.DeleteAclsFilterResult(error_code=code, error_message=msg, matching_acls=[]) for _ in req.filters])
    return DSA.DescribeAclsResponse(throttle_time_ms=0, error_code=code,
                                    error_message="No Authorizer is configured on the broker", resources=[])


def cluster_authorization_failed(api: str, req):
    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    if api == "create":
        return CA.CreateAclsResponse(throttle_time_ms=0, results=[
            CA.AclCreationResult(error_code=code, error_message=None) for _ in req.creations])
    if api == "delete":
        return DA.DeleteAclsResponse(throttle_time_ms=0, filter_results=[
            DA.DeleteAclsFilterResult(error_code=code, error_message=None, matching_acls=[]) for _ in req.filters])
    return DSA.DescribeAclsResponse(throttle_time_ms=0, error_code=code, error_message=None, resources=[])
