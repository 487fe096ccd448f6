"""kbroker acls: add, list and remove ACLs (Kafka's ``kafka-acls.sh``, AclCommand, with --bootstrap-server).

    kbroker acls --bootstrap-server HOST:PORT [--command-config admin.properties] \\
        --add --allow-principal User:alice --operation Read --operation Write --topic orders
    kbroker acls --bootstrap-server HOST:PORT --add --allow-principal User:bob --consumer --topic t --group g
    kbroker acls --bootstrap-server HOST:PORT --add --deny-principal User:eve --operation All \\
        --topic logs- --resource-pattern-type prefixed
    kbroker acls --bootstrap-server HOST:PORT --list [--topic orders] [--principal User:alice]
    kbroker acls --bootstrap-server HOST:PORT --remove --allow-principal User:alice --operation Read --topic orders

Resources: --topic, --group, --transactional-id (repeatable), --cluster. --resource-pattern-type:
literal (the default for --add / --remove) or prefixed; for --list / --remove also any (the
default for --list) and match. Operations by Kafka's names (Read, Write, Create, Delete, Alter,
Describe, ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, All; default All).
--producer and --consumer add Kafka's convenience sets. Output as AclCommand prints it
(``Adding ACLs for resource `ResourcePattern(...)`:`` then one
``\t(principal=..., host=..., operation=..., permissionType=...)`` line per ACL). --remove does
not prompt (as Kafka's with --force). SASL / TLS: the --command-config property file holds the
client's security.protocol, sasl.mechanism, sasl.jaas.config (or sasl.username/password) settings.
"""
from __future__ import annotations

import sys

from kbroker.security.authorizer import (
    CLUSTER_NAME, AclFilter, AclOperation as Op, AclPermissionType as Perm, PatternType as PT,
    ResourceType as RT, StandardAcl,
)
from kbroker.tools._common import KafkaArgumentParser, ToolError, admin, run_tool

PURPOSE = "This tool helps to manage acls on kafka."
#: "read", "describeconfigs", "idempotentwrite", ... -> operation
_OPS = {o.name.replace("_", "").lower(): o for o in Op if o not in (Op.UNKNOWN, Op.ANY)}
_PATTERNS = {"literal": PT.LITERAL, "prefixed": PT.PREFIXED, "any": PT.ANY, "match": PT.MATCH}


def build_parser() -> KafkaArgumentParser:
    p = KafkaArgumentParser("kbroker acls", PURPOSE)
    a = p.add_argument
    a("--bootstrap-server", metavar="server to connect to",
      help="A list of host/port pairs to use for establishing the connection to the Kafka cluster.")
    a("--command-config", metavar="command-config",
      help="A property file containing configs to be passed to Admin Client.")
    a("--add", action="store_true", help="Indicates you are trying to add ACLs.")
    a("--remove", action="store_true", help="Indicates you are trying to remove ACLs.")
    a("--list", action="store_true", help="List ACLs for the specified resource, use --topic <topic> or "
      "--group <group> or --cluster to specify a resource.")
    a("--topic", action="append", metavar="topic", help="topic to which ACLs should be added or removed.")
    a("--group", action="append", metavar="group", help="Consumer Group to which the ACLs should be added or "
      "removed.")
    a("--transactional-id", action="append", metavar="transactional-id",
      help="The transactionalId to which ACLs should be added or removed.")
    a("--cluster", action="store_true", help="Add/Remove cluster ACLs.")
    a("--resource-pattern-type", metavar="ANY|MATCH|LITERAL|PREFIXED",
      help="The type of the resource pattern or pattern filter: literal or prefixed when adding; any or "
           "match may also filter when listing or removing.")
    a("--allow-principal", action="append", metavar="allow-principal",
      help="principal is in principalType:name format.")
    a("--deny-principal", action="append", metavar="deny-principal",
      help="principal is in principalType:name format. By default anyone not added through --allow-principal "
           "is denied access.")
    a("--principal", action="append", metavar="principal", help="List ACLs for the specified principal.")
    a("--allow-host", action="append", metavar="allow-host",
      help="Host from which principals listed in --allow-principal will have access (default: *).")
    a("--deny-host", action="append", metavar="deny-host",
      help="Host from which principals listed in --deny-principal will be denied access (default: *).")
    a("--operation", action="append", metavar="operation",
      help="Operation that is being allowed or denied: Describe, DescribeConfigs, Alter, IdempotentWrite, "
           "Read, Delete, Create, ClusterAction, All, Write, AlterConfigs (default: All)")
    a("--producer", action="store_true", help="Convenience option to add/remove ACLs for producer role.")
    a("--consumer", action="store_true", help="Convenience option to add/remove ACLs for consumer role.")
    a("--idempotent", action="store_true", help="With --producer: IdempotentWrite on the cluster too.")
    a("--force", action="store_true", help="Assume Yes to all queries and do not prompt.")
    return p


def _pattern(o, default: int) -> int:
    if o.resource_pattern_type is None:
        return default
    pt = _PATTERNS.get(o.resource_pattern_type.strip().lower())
    if pt is None:
        raise ToolError(f"Invalid resource pattern type: {o.resource_pattern_type}")
    return pt


def _resources(o, pattern: int, required: bool) -> list[tuple]:
    res = [(RT.TOPIC, t, pattern) for t in o.topic or []]
    res += [(RT.GROUP, g, pattern) for g in o.group or []]
    res += [(RT.TRANSACTIONAL_ID, t, pattern) for t in o.transactional_id or []]
    if o.cluster:
        res.append((RT.CLUSTER, CLUSTER_NAME, pattern))
    if required and not res:
        raise ToolError("You must provide at least one resource: --topic <topic> or --cluster or --group <group> "
                        "or --transactional-id <id>")
    return res


def _operations(o) -> list[int]:
    out = []
    for name in o.operation or ["All"]:
        op = _OPS.get(name.replace("_", "").replace("-", "").lower())
        if op is None:
            raise ToolError(f"Invalid operation: {name}")
        out.append(op)
    return out


def _entries(o) -> list[tuple]:
    """(principal, host, operation, permission) for --allow/--deny-principal x hosts x operations."""
    ops = _operations(o)
    out = []
    for principals, hosts, perm in ((o.allow_principal, o.allow_host, Perm.ALLOW),
                                    (o.deny_principal, o.deny_host, Perm.DENY)):
        for principal in principals or []:
            if ":" not in principal:
                raise ToolError(f"Could not parse principal from `{principal}` (no colon is present separating "
                                "the principal type from the principal name)")
            for host in hosts or ["*"]:
                out += [(principal, host, op, perm) for op in ops]
    if not out:
        raise ToolError("You must specify one of: --allow-principal, --deny-principal when trying to add ACLs.")
    return out


def _bindings(o, pattern: int) -> list[StandardAcl]:
    """The ACLs --add (or a --remove naming principals) means, --producer / --consumer expanded."""
    if not (o.producer or o.consumer):
        return [StandardAcl(rt, name, pt, principal, host, op, perm)
                for rt, name, pt in _resources(o, pattern, True) for principal, host, op, perm in _entries(o)]
    if not o.topic or (o.consumer and not o.group):
        raise ToolError("With --producer you must specify a --topic; with --consumer a --topic and a --group")
    out = []
    seen = set()
    for principal, host, _op, perm in _entries(o):
        if (principal, host, perm) in seen:
            continue
        seen.add((principal, host, perm))
        ops = []
        if o.producer:
            ops += [Op.WRITE, Op.DESCRIBE, Op.CREATE]
        if o.consumer:
            ops += [Op.READ, Op.DESCRIBE]
        out += [StandardAcl(RT.TOPIC, t, pattern, principal, host, op, perm)
                for t in o.topic for op in dict.fromkeys(ops)]
        if o.consumer:
            out += [StandardAcl(RT.GROUP, g, pattern, principal, host, Op.READ, perm) for g in o.group]
        if o.producer:
            out += [StandardAcl(RT.TRANSACTIONAL_ID, x, pattern, principal, host, op, perm)
                    for x in o.transactional_id or [] for op in (Op.WRITE, Op.DESCRIBE)]
            if o.idempotent:
                out.append(StandardAcl(RT.CLUSTER, CLUSTER_NAME, PT.LITERAL, principal, host,
                                       Op.IDEMPOTENT_WRITE, perm))
    return out


def resource_text(rt: int, name: str, pt: int) -> str:
    return f"ResourcePattern(resourceType={RT(rt).name}, name={name}, patternType={PT(pt).name})"


def entry_text(a: StandardAcl) -> str:
    return (f"(principal={a.principal}, host={a.host}, operation={Op(a.operation).name}, "
            f"permissionType={Perm(a.permission_type).name})")


def _print_grouped(title: str, acls, out) -> None:
    groups: dict = {}
    for a in acls:
        groups.setdefault((a.resource_type, a.resource_name, a.pattern_type), []).append(a)
    for key in sorted(groups):
        print(f"{title} `{resource_text(*key)}`: ", file=out)
        for a in sorted(set(groups[key])):
            print(f" \t{entry_text(a)} ", file=out)
        print(file=out)


def _list(adm, resources, principals, out) -> None:
    filters = [AclFilter(rt, name, pt, None, None, Op.ANY, Perm.ANY) for rt, name, pt in dict.fromkeys(resources)]
    if not filters:
        filters = [AclFilter(RT.ANY, None, PT.ANY, None, None, Op.ANY, Perm.ANY)]
    found = {a for f in filters for a in adm.describe_acls(f)}
    if not principals:
        _print_grouped("Current ACLs for resource", found, out)
        return
    for principal in principals:
        mine = [a for a in found if a.principal == principal]
        if mine:
            print(f"ACLs for principal `{principal}`", file=out)
            _print_grouped("Current ACLs for resource", mine, out)


def _raise_first(errors) -> None:
    for e in errors:
        if e is not None and not isinstance(e, list):
            raise e


def _main(argv, out) -> int:
    o = build_parser().parse(argv, out)
    if o is None:
        return 0
    if not o.bootstrap_server:
        raise ToolError("Missing required argument \"[bootstrap-server]\"")
    if sum(bool(x) for x in (o.add, o.remove, o.list)) != 1:
        raise ToolError("Command must include exactly one action: --list, --add, --remove.")
    adm = admin(o.bootstrap_server, o.command_config)
    try:
        if o.add:
            pattern = _pattern(o, PT.LITERAL)
            if pattern not in (PT.LITERAL, PT.PREFIXED):
                raise ToolError(f"A '--resource-pattern-type' value of '{o.resource_pattern_type}' is not valid "
                                "when adding acls.")
            acls = _bindings(o, pattern)
            _print_grouped("Adding ACLs for resource", acls, out)
            _raise_first(adm.create_acls(acls))
            _list(adm, [(a.resource_type, a.resource_name, a.pattern_type) for a in acls], None, out)
        elif o.remove:
            pattern = _pattern(o, PT.LITERAL)
            if o.allow_principal or o.deny_principal:
                filters = [AclFilter(*a) for a in _bindings(o, pattern)]
            else:       # every ACL of the resources
                filters = [AclFilter(rt, name, pt, None, None, Op.ANY, Perm.ANY)
                           for rt, name, pt in _resources(o, pattern, True)]
            removed = adm.delete_acls(filters)
            _raise_first(removed)
            _print_grouped("Removed ACLs for resource", [a for r in removed for a in r], out)
        else:
            _list(adm, _resources(o, _pattern(o, PT.ANY), False), o.principal, out)
    finally:
        adm.close()
    return 0


def main(argv: list[str] | None = None, out=None) -> int:
    return run_tool(_main, sys.argv[1:] if argv is None else argv, out)


if __name__ == "__main__":
    sys.exit(main())
