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

Not here yet: quotas (``users`` quota keys, ``clients``, ``ips``: the tool says so and exits 1),
``broker-loggers``, ``client-metrics``, ``groups``.
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
QUOTA_TYPES = {"clients", "ips"}
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
    if any(t in QUOTA_TYPES for t in types):
        raise ToolError(f"entity type {'/'.join(t for t in types if t in QUOTA_TYPES)}: quotas are not "
                        "supported by kbroker yet")
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


def alter_users(adm, name: str, add: dict, delete: list, out) -> None:
    """SCRAM-SHA-256/512 entries of --add-config (``[iterations=N,password=P]``) and --delete-config."""
    from kbroker.security.scram import MAX_ITERATIONS, MIN_ITERATIONS, parse_credential_spec

    if not add and not delete:
        raise ToolError("At least one of --add-config, --add-config-file, or --delete-config must be specified "
                        "with --alter")
    other = [k for k in list(add) + delete if k not in SCRAM_MECHANISMS]
    if other:
        raise ToolError(f"user configs {','.join(other)}: only SCRAM credentials ({', '.join(SCRAM_MECHANISMS)}) "
                        "are supported by kbroker yet (no quotas)")
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
    adm.alter_user_scram_credentials(upsertions, [(name, m) for m in delete])
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
    etype, name = entities(o)
    add = parse_add_config(o.add_config, o.add_config_file) if o.alter else {}
    delete = parse_delete_config(o.delete_config)
    adm = admin(o.bootstrap_server, o.command_config)
    try:
        if etype == "users":
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


def main(argv: list[str] | None = None, out=None) -> int:
    return run_tool(_main, sys.argv[1:] if argv is None else argv, out)


if __name__ == "__main__":
    sys.exit(main())
