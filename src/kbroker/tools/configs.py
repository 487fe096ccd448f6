"""kbroker configs: describe and alter topic and broker configs (Kafka's ``kafka-configs.sh``,
ConfigCommand, with --bootstrap-server).

    kbroker configs --bootstrap-server HOST:PORT --describe --entity-type topics [--entity-name T] [--all]
    kbroker configs --bootstrap-server HOST:PORT --describe --entity-type brokers [--entity-name 1 | --entity-default]
    kbroker configs --bootstrap-server HOST:PORT --alter --entity-type topics --entity-name T \\
        --add-config 'retention.ms=60000,cleanup.policy=[compact,delete]' --delete-config segment.ms

Output as Kafka prints it: ``Dynamic configs for topic T are:`` (``All configs ...`` with
``--all``, which also shows defaults and static settings), then one
``  name=value sensitive=false synonyms={SOURCE:name=value, ...}`` line per entry, sorted
by name. ``--alter`` uses IncrementalAlterConfigs (SET / DELETE), as Kafka 4 does for every
entity type; deleting a config the entity does not set is refused (``Invalid config(s)``).

SCRAM credentials of ``users`` (Describe/AlterUserScramCredentials; the salt and salted
password are made here, the password never goes over the wire)::

    kbroker configs --bootstrap-server HOST:PORT --alter --entity-type users --entity-name alice \\
        --add-config 'SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=alice-secret]'
    kbroker configs --bootstrap-server HOST:PORT --alter --entity-type users --entity-name alice \\
        --delete-config SCRAM-SHA-512
    kbroker configs --bootstrap-server HOST:PORT --describe --entity-type users [--entity-name alice]

printing Kafka's ``SCRAM credential configs for user-principal 'alice' are SCRAM-SHA-256=iterations=8192``.
Each mechanism's change is its own AlterUserScramCredentials request (deletions first): a KRaft
controller refuses a user named twice in one request (DUPLICATE_RESOURCE), which Kafka's
ConfigCommand runs into when one command names two mechanisms.

Client quotas of ``users`` and ``clients`` (together, for a user's client) and ``ips``
(Describe/AlterClientQuotas; ``--entity-default`` is the type's default entity, names pair
with types in command-line order as in Kafka's ConfigCommand)::

    kbroker configs --bootstrap-server HOST:PORT --alter --entity-type users --entity-name alice \
        --entity-type clients --entity-default --add-config 'producer_byte_rate=1048576,request_percentage=50'
    kbroker configs --bootstrap-server HOST:PORT --describe --entity-type clients [--entity-name C]

printing Kafka's ``Quota configs for user-principal 'alice', the default client-id are
producer_byte_rate=1048576.0, request_percentage=50.0``.

Not here yet: ``broker-loggers``, ``client-metrics``, ``groups``.
"""
from __future__ import annotations

import re
import sys

from kbroker.client.admin import CONFIG_SOURCES, DELETE, RESOURCE_BROKER, RESOURCE_TOPIC, SET, ConfigResource
from kbroker.tools._common import KafkaArgumentParser, ToolError, admin, load_properties, run_tool

PURPOSE = ("This tool helps to manipulate and describe entity config for a topic, client, user, broker, ip, "
           "client-metrics or group")
ENTITY_TYPES = ["topics", "clients", "users", "brokers", "broker-loggers", "ips", "client-metrics", "groups"]
SUPPORTED = {"topics": RESOURCE_TOPIC, "brokers": RESOURCE_BROKER}
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_SCRAM_ITERATIONS = 4096
BROKER_DEFAULT = ""


def build_parser() -> KafkaArgumentParser:
    p = KafkaArgumentParser("kbroker configs", PURPOSE)
    a = p.add_argument
    a("--bootstrap-server", metavar="server to connect to", help="The Kafka servers to connect to.")
    a("--command-config", metavar="command config property file",
      help="Property file containing configs to be passed to Admin Client. This is used only with "
           "--bootstrap-server option for describing and altering broker configs.")
    a("--alter", action="store_true", help="Alter the configuration for the entity.")
    a("--describe", action="store_true", help="List configs for the given entity.")
    a("--all", action="store_true", help="List all configs for the given entity, including static configs if "
                                         "available.")
    a("--entity-type", action="append", metavar="entity-type",
      help="Type of entity (topics/clients/users/brokers/broker-loggers/ips/client-metrics/groups)")
    a("--entity-name", action="append", metavar="entity-name",
      help="Name of entity (topic name/client id/user principal name/broker id/ip/client metrics/group id)")
    a("--entity-default", action="store_true",
      help="Default entity name for clients/users/brokers/ips (applies to corresponding entity type)")
    a("--add-config", metavar="add-config",
      help="Key Value pairs of configs to add. Square brackets can be used to group values which contain commas: "
           "'k1=v1,k2=[v1,v2,v2],k3=v3'.")
    a("--add-config-file", metavar="add-config-file",
      help="Path to a properties file with configs to add. See add-config for a list of valid configurations.")
    a("--delete-config", action="append", metavar="delete-config", help="config keys to remove 'k1,k2'")
    a("--force", action="store_true", help="Suppress console prompts")
    a("--topic", metavar="topic", help="The topic's name.")
    a("--broker", metavar="broker-id", help="The broker's ID.")
    a("--broker-defaults", action="store_true", help="The config defaults for all brokers.")
    return p


_QUOTA_ENTITY = {"users": "user", "clients": "client-id", "ips": "ip"}
_QUOTA_LABEL = {"user": "user-principal", "client-id": "client-id", "ip": "ip"}
QUOTA_KEYS = {"producer_byte_rate", "consumer_byte_rate", "request_percentage", "controller_mutation_rate",
              "connection_creation_rate"}


def _ordered_names(argv) -> list:
    """--entity-name values and --entity-default ("") in command-line order (ConfigCommand
    pairs them with --entity-type in that order)."""
    out = []
    it = iter(argv)
    for tok in it:
        if tok == "--entity-name":
            out.append(next(it, ""))
        elif tok.startswith("--entity-name="):
            out.append(tok.split("=", 1)[1])
        elif tok == "--entity-default":
            out.append(BROKER_DEFAULT)
    return out


def quota_entity(o, argv) -> list[tuple[str, str | None]] | None:
    """The client quota entity [(type, name or None = default)] of users/clients/ips
    options, or None for other entity types."""
    types = list(o.entity_type or [])
    if not types or not all(t in _QUOTA_ENTITY for t in types):
        return None
    if len(types) > 1 and sorted(types) != ["clients", "users"]:
        raise ToolError("Only 'users' and 'clients' entity types may be specified together")
    names = _ordered_names(argv)
    if len(names) > len(types):
        raise ToolError("Only one entity name may be given per entity type")
    if o.alter and len(names) < len(types):
        raise ToolError("An entity name must be specified for every entity type with --alter of users, "
                        "clients or ips (or --entity-default)")
    ent = []
    for i, t in enumerate(types):
        n = names[i] if i < len(names) else None
        ent.append((_QUOTA_ENTITY[t], n if n is None else (n or None), i < len(names)))
    return ent


def entities(o) -> tuple[str, str | None]:
    """(entity type, entity name or None; "" = the default entity), checked as Kafka checks them."""
    types = list(o.entity_type or [])
    names: list = list(o.entity_name or [])
    if o.entity_default:
        names.append(BROKER_DEFAULT)
    if o.topic is not None or o.broker is not None or o.broker_defaults:
        if types or o.entity_name or o.entity_default:
            raise ToolError("--entity-{type,name,default} should not be used in conjunction with specific "
                            "entity flags")
        if o.topic is not None:
            types.append("topics"), names.append(o.topic)
        if o.broker is not None or o.broker_defaults:
            types.append("brokers"), names.append(o.broker if o.broker is not None else BROKER_DEFAULT)
    if not types:
        raise ToolError("At least one entity type must be specified")
    for t in types:
        if t not in ENTITY_TYPES:
            raise ToolError(f"Invalid entity type {t}, the entity type must be one of {', '.join(ENTITY_TYPES)} "
                            "with a --bootstrap-server argument")
    if len(types) > 1:
        raise ToolError("Only 'users' and 'clients' entity types may be specified together")
    etype = types[0]
    if etype == "users":
        if len(names) > 1:
            raise ToolError("Only one entity name may be given per entity type")
        name = names[0] if names else None
        if name == BROKER_DEFAULT:
            raise ToolError("The use of --entity-default or --user-defaults is not allowed with User SCRAM "
                            "Credentials")
        if o.alter and name is None:
            raise ToolError("An entity name must be specified with --alter of users")
        return etype, name
    if etype not in SUPPORTED:
        raise ToolError(f"entity type {etype} is not supported by kbroker yet")
    if len(names) > 1:
        raise ToolError("Only one entity name may be given per entity type")
    name = names[0] if names else None
    if name == BROKER_DEFAULT and etype == "topics":
        raise ToolError("--entity-default must not be specified with --describe of topics")
    if etype == "brokers" and name:
        try:
            int(name)
        except ValueError:
            raise ToolError(f"The entity name for brokers must be a valid integer broker id, but it is: {name}") \
                from None
    if o.alter and name is None:
        raise ToolError("An entity-name or default entity must be specified with --alter of users, clients, "
                        "brokers or ips" if etype == "brokers" else f"An entity name must be specified with --alter "
                                                                    f"of {etype}")
    if name is not None and etype == "topics" and not re.fullmatch(r"[a-zA-Z0-9._-]{1,249}", name):
        raise ToolError(f"Topic name \"{name}\" is illegal, it contains a character other than ASCII alphanumerics, "
                        "'.', '_' and '-'")
    return etype, name


def parse_add_config(value: str | None, path: str | None) -> dict[str, str]:
    """``k1=v1,k2=[v1,v2],k3=`` (commas inside brackets belong to the value), plus a file."""
    props = load_properties(path) if path else {}
    if value:
        for pair in re.split(r",(?=[^\]]*(?:\[|$))", value):
            kv = re.split(r"\s*=\s*(?=[^\]]*(?:\[|$))", pair)
            if len(kv) != 2:
                raise ToolError('Invalid entity config: all configs to be added must be in the format "key=val".')
            props[kv[0].strip()] = re.sub(r"\[?\]?", "", kv[1]).strip()
    for k in props:
        if not re.fullmatch(r"[a-zA-Z0-9._-]*", k):
            raise ToolError(f"Invalid character found for config key: {k}")
    return props


def parse_delete_config(values) -> list[str]:
    return [k.strip() for v in values or [] for k in v.split(",") if k.strip()]


_DYNAMIC_SOURCE = {("topics", False): 1, ("brokers", False): 2, ("brokers", True): 3}


def resource_config(adm, etype: str, name: str, describe_all: bool, synonyms: bool = True) -> list:
    """The entity's config entries, sorted by name: dynamic ones only, unless ``describe_all``."""
    res = ConfigResource(SUPPORTED[etype], name)
    entries = adm.describe_configs([res], include_synonyms=synonyms)[res]
    want = None if describe_all else _DYNAMIC_SOURCE[(etype, name == BROKER_DEFAULT)]
    return sorted((e for e in entries.values() if want is None or e.source == want), key=lambda e: e.name)


def _value(v) -> str:
    return "null" if v is None else v


def describe(adm, etype: str, name: str | None, describe_all: bool, out) -> None:
    if name is not None:
        names = [name]
    elif etype == "topics":
        names = adm.list_topics()
    else:
        names = [str(b.node_id) for b in sorted(adm.describe_cluster().brokers, key=lambda b: b.node_id)]
        names.append(BROKER_DEFAULT)
    for n in names:
        if n == BROKER_DEFAULT:
            print(f"Default configs for {etype} in the cluster are:", file=out)
        else:
            print(f"{'All' if describe_all else 'Dynamic'} configs for {etype[:-1]} {n} are:", file=out)
        for e in resource_config(adm, etype, n, describe_all):
            syns = ", ".join(f"{CONFIG_SOURCES.get(src, 'UNKNOWN')}:{sn}={_value(sv)}" for sn, sv, src in e.synonyms)
            print(f"  {e.name}={_value(e.value)} sensitive={str(e.is_sensitive).lower()} synonyms={{{syns}}}",
                  file=out)


def alter(adm, etype: str, name: str, add: dict, delete: list, out) -> None:
    if not add and not delete:
        raise ToolError("At least one of --add-config, --add-config-file, or --delete-config must be specified "
                        "with --alter")
    old = {e.name for e in resource_config(adm, etype, name, False, synonyms=False)}
    invalid = [k for k in delete if k not in old]
    if invalid:
        raise ToolError(f"Invalid config(s): {','.join(invalid)}")
    res = ConfigResource(SUPPORTED[etype], name)
    ops = [(k, SET, v) for k, v in add.items()] + [(k, DELETE, None) for k in delete]
    adm.incremental_alter_configs({res: ops})
    if name:
        print(f"Completed updating config for {etype[:-1]} {name}.", file=out)
    else:
        print(f"Completed updating default config for {etype} in the cluster.", file=out)


def describe_users(adm, name: str | None, out) -> None:
    creds = adm.describe_user_scram_credentials(None if name is None else [name], raise_on_error=False)
    for user, info in creds.items():
        if isinstance(info, Exception):
            if name is not None and getattr(info, "code", None) == 91:    # RESOURCE_NOT_FOUND
                continue                                                # Kafka prints nothing
            raise info
        text = ", ".join(f"{m}=iterations={i}" for m, i in sorted(info.items()))
        print(f"SCRAM credential configs for user-principal '{user}' are {text}", file=out)


def _entity_text(entity) -> str:
    order = {"user": 0, "client-id": 1, "ip": 2}
    return ", ".join(f"{_QUOTA_LABEL[t]} '{n}'" if n is not None else f"the default {_QUOTA_LABEL[t]}"
                     for t, n in sorted(entity, key=lambda e: order.get(e[0], 9)))


def describe_quotas(adm, entity, out) -> None:
    """Kafka's describeClientQuotaAndUserScramCredentialConfigs (the quota half): entities
    given by name are matched exactly, --entity-default the default, a bare type any name."""
    comps = [(t, 2, None) if not named else (t, 1, None) if n is None else (t, 0, n) for t, n, named in entity]
    found = adm.describe_client_quotas(comps, strict=True)
    for ent, quotas in sorted(found.items(), key=lambda kv: repr(kv[0])):
        text = ", ".join(f"{k}={float(v)}" for k, v in sorted(quotas.items()))
        print(f"Quota configs for {_entity_text(ent)} are {text}", file=out)


def alter_quotas(adm, entity, add: dict, delete: list, out) -> None:
    ops: dict = {}
    for k, v in add.items():
        try:
            ops[k] = float(v)
        except ValueError:
            raise ToolError(f"Cannot parse quota configuration value for {k}: {v}") from None
    for k in delete:
        ops[k] = None
    ent = tuple((t, n) for t, n, _ in entity)
    res = adm.alter_client_quotas([(ent, ops)], raise_on_error=False)
    for err in res.values():
        if err is not None:
            raise ToolError(str(err))


def alter_users(adm, name: str, add: dict, delete: list, out, quota_done: bool = False) -> None:
    """SCRAM-SHA-256/512 entries of --add-config (``[iterations=N,password=P]``) and --delete-config."""
    from kbroker.security.scram import MAX_ITERATIONS, MIN_ITERATIONS, parse_credential_spec

    if not add and not delete and not quota_done:
        raise ToolError("At least one of --add-config, --add-config-file, or --delete-config must be specified "
                        "with --alter")
    other = [k for k in list(add) + delete if k not in SCRAM_MECHANISMS]
    if other:
        raise ToolError(f"Invalid config(s): {','.join(other)}")
    upsertions = []
    for mech, spec in add.items():
        try:
            fields = parse_credential_spec(spec)
            iterations = int(fields.get("iterations", DEFAULT_SCRAM_ITERATIONS))
        except ValueError as e:
            raise ToolError(f"Invalid {mech} credential: {e}".replace(fields_password(spec), "***")) from None
        if "salt" in fields:
            raise ToolError("kbroker makes the salt itself; give iterations and password only")
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise ToolError(f"{mech} iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}")
        upsertions.append((name, mech, iterations, fields["password"]))
    for m in delete:
        adm.alter_user_scram_credentials([], [(name, m)])
    for u in upsertions:
        adm.alter_user_scram_credentials([u], [])
    print(f"Completed updating config for user {name}.", file=out)


def fields_password(spec: str) -> str:
    """The password text of a credential spec, to keep it out of error messages ("" if none)."""
    _, sep, rest = spec.partition("password=")
    return rest.rstrip("]") if sep and rest.rstrip("]") else "\0"


def _main(argv, out) -> int:
    o = build_parser().parse(argv, out)
    if o is None:
        return 0
    if not o.bootstrap_server:
        raise ToolError("One of the required --bootstrap-server or --bootstrap-controller arguments must be "
                        "specified")
    if o.alter == o.describe:
        raise ToolError("Command must include exactly one action: --describe, --alter")
    if o.add_config and o.add_config_file:
        raise ToolError("Only one of --add-config or --add-config-file must be specified")
    if o.describe and (o.add_config or o.add_config_file or o.delete_config):
        raise ToolError("Option --add-config, --add-config-file and --delete-config can only be used with --alter")
    if o.all and not o.describe:
        raise ToolError("Option --all can only be used with --describe")
    qent = quota_entity(o, argv)
    if qent is None:
        etype, name = entities(o)
    elif len(qent) == 1 and qent[0][0] == "user" and (qent[0][1] is not None or not qent[0][2]):
        etype, name = "users", qent[0][1]        # a named user (or every user): SCRAM credentials too
    else:
        etype, name = "quota", None
    add = parse_add_config(o.add_config, o.add_config_file) if o.alter else {}
    delete = parse_delete_config(o.delete_config)
    adm = admin(o.bootstrap_server, o.command_config)
    try:
        if qent is not None:
            _main_quota(adm, o, qent, etype, name, add, delete, out)
        elif etype == "users":
            if o.describe:
                describe_users(adm, name, out)
            else:
                alter_users(adm, name, add, delete, out)
        elif o.describe:
            describe(adm, etype, name, o.all, out)
        else:
            alter(adm, etype, name, add, delete, out)
    finally:
        adm.close()
    return 0


def _main_quota(adm, o, qent, etype, name, add, delete, out) -> None:
    """users / clients / ips: quotas, and for a single named user also SCRAM credentials."""
    qadd = {k: v for k, v in add.items() if k not in SCRAM_MECHANISMS}
    qdel = [k for k in delete if k not in SCRAM_MECHANISMS]
    scram = etype == "users"
    if o.describe:
        describe_quotas(adm, qent, out)
        if scram:
            describe_users(adm, name, out)
        return
    if not add and not delete:
        raise ToolError("At least one of --add-config, --add-config-file, or --delete-config must be specified "
                        "with --alter")
    if (not scram or name is None) and len(qadd) + len(qdel) < len(add) + len(delete):
        if any(n is None and named for _t, n, named in qent):
            raise ToolError("The use of --entity-default or --user-defaults is not allowed with User SCRAM "
                            "Credentials")
        raise ToolError("SCRAM credentials can only be altered for a single named user")
    bad = [k for k in list(qadd) + qdel if k not in QUOTA_KEYS]
    if bad:
        raise ToolError(f"Invalid config(s): {','.join(bad)}")
    if qadd or qdel:
        alter_quotas(adm, qent, qadd, qdel, out)
    if scram and name is not None:
        alter_users(adm, name, {k: v for k, v in add.items() if k in SCRAM_MECHANISMS},
                    [k for k in delete if k in SCRAM_MECHANISMS], out, quota_done=bool(qadd or qdel))
        return
    t, n, _ = qent[0]
    kind = {"user": "user", "client-id": "client", "ip": "ip"}
    if len(qent) == 1 and n is None:
        print(f"Completed updating default config for {o.entity_type[0]} in the cluster.", file=out)
    else:
        print(f"Completed updating config for {kind[t]} {n if n is not None else '<default>'}.", file=out)


def main(argv: list[str] | None = None, out=None) -> int:
    return run_tool(_main, sys.argv[1:] if argv is None else argv, out)


if __name__ == "__main__":
    sys.exit(main())
