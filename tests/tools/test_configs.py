"""kbroker configs (kafka-configs.sh) against a real broker, checked with confluent-kafka's
AdminClient.describe_configs."""
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from tests.broker.kafka_helpers import create_topic
from tests.tools.conftest import name


def described(bootstrap, rtype, rname):
    a = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(rtype, rname)
    return a.describe_configs([res])[res].result(timeout=15)


def entries(stdout):
    """{name: value} of the ``  name=value sensitive=... synonyms={...}`` lines."""
    out = {}
    for ln in stdout.splitlines():
        if ln.startswith("  "):
            left = ln.strip().split(" sensitive=")[0]
            k, _, v = left.partition("=")
            out[k] = v
    return out


def test_topic_configs(broker, tool):
    t = name("cfg")
    create_topic(broker.bootstrap, t, partitions=1)
    r = tool("configs", "--describe", "--entity-type", "topics", "--entity-name", t)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"Dynamic configs for topic {t} are:\n"
    r = tool("configs", "--alter", "--entity-type", "topics", "--entity-name", t,
             "--add-config", "retention.ms=600000,cleanup.policy=[compact,delete],segment.ms=3600000")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"Completed updating config for topic {t}.\n"
    got = described(broker.bootstrap, ResourceType.TOPIC, t)
    assert got["retention.ms"].value == "600000" and got["cleanup.policy"].value == "compact,delete"
    r = tool("configs", "--describe", "--entity-type", "topics", "--entity-name", t)
    lines = r.stdout.splitlines()
    assert lines[0] == f"Dynamic configs for topic {t} are:"
    assert lines[1] == ("  cleanup.policy=compact,delete sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:"
                        "cleanup.policy=compact,delete, DEFAULT_CONFIG:log.cleanup.policy=delete}")
    dynamic = {k: e.value for k, e in got.items() if e.source == 1}   # DYNAMIC_TOPIC_CONFIG
    assert entries(r.stdout) == dynamic == {"retention.ms": "600000", "cleanup.policy": "compact,delete",
                                            "segment.ms": "3600000"}
    # --delete-config; the shortcut --topic names the same entity
    r = tool("configs", "--alter", "--topic", t, "--delete-config", "segment.ms,cleanup.policy")
    assert r.returncode == 0, r.stderr
    got = described(broker.bootstrap, ResourceType.TOPIC, t)
    assert {k for k, e in got.items() if e.source == 1} == {"retention.ms"}
    # --all: every entry with its value, as the AdminClient sees them
    r = tool("configs", "--describe", "--entity-type", "topics", "--entity-name", t, "--all")
    assert r.stdout.splitlines()[0] == f"All configs for topic {t} are:"
    allv = entries(r.stdout)
    assert allv == {k: (e.value if e.value is not None else "null") for k, e in got.items()}
    assert "segment.bytes" in allv and allv["retention.ms"] == "600000"
    # refusals: one line, exit 1
    r = tool("configs", "--alter", "--entity-type", "topics", "--entity-name", t, "--delete-config", "segment.ms")
    assert r.returncode == 1 and r.stderr.strip() == "Error: Invalid config(s): segment.ms"
    r = tool("configs", "--alter", "--entity-type", "topics", "--entity-name", t, "--add-config", "no.such=1")
    assert r.returncode == 1 and r.stderr.startswith("Error: ") and len(r.stderr.strip().splitlines()) == 1
    r = tool("configs", "--alter", "--entity-type", "topics", "--entity-name", t, "--add-config", "novalue")
    assert r.returncode == 1 and "key=val" in r.stderr


def test_broker_configs(broker, tool):
    key, value = "log.retention.ms", "604800001"
    r = tool("configs", "--alter", "--entity-type", "brokers", "--entity-default", "--add-config", f"{key}={value}")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "Completed updating default config for brokers in the cluster.\n"
    try:
        got = described(broker.bootstrap, ResourceType.BROKER, "1")[key]
        assert got.value == value and got.source == 3  # DYNAMIC_DEFAULT_BROKER_CONFIG
        r = tool("configs", "--describe", "--entity-type", "brokers", "--entity-default")
        assert r.stdout.splitlines() == [
            "Default configs for brokers in the cluster are:",
            f"  {key}={value} sensitive=false synonyms={{DYNAMIC_DEFAULT_BROKER_CONFIG:{key}={value}, "
            "DEFAULT_CONFIG:log.retention.hours=168}"]
        r = tool("configs", "--describe", "--entity-type", "brokers")   # every broker, then the default
        assert r.stdout.splitlines()[0] == "Dynamic configs for broker 1 are:"
        assert "Default configs for brokers in the cluster are:" in r.stdout
        r = tool("configs", "--describe", "--entity-type", "brokers", "--entity-name", "1", "--all")
        assert entries(r.stdout)[key] == value and "num.partitions" in entries(r.stdout)
    finally:
        r = tool("configs", "--alter", "--entity-type", "brokers", "--entity-default", "--delete-config", key)
        assert r.returncode == 0, r.stderr
    assert described(broker.bootstrap, ResourceType.BROKER, "1")[key].source != 3


def test_unsupported_entities_and_usage(tool):
    r = tool("configs", "--alter", "--entity-type", "users", "--entity-name", "alice",
             "--add-config", "producer_byte_rate=1024,fetch_rate=2")
    assert r.returncode == 1 and r.stderr.strip() == "Error: Invalid config(s): fetch_rate"
    r = tool("configs", "--alter", "--entity-type", "ips", "--entity-type", "users", "--entity-default",
             "--entity-default", "--add-config", "connection_creation_rate=3")
    assert r.returncode == 1 and "Only 'users' and 'clients' entity types may be specified together" in r.stderr
    r = tool("configs", "--describe", "--entity-type", "tables")
    assert r.returncode == 1 and "Invalid entity type tables" in r.stderr
    r = tool("configs", "--describe", "--entity-type", "brokers", "--entity-name", "one")
    assert r.returncode == 1 and "valid integer broker id" in r.stderr
    r = tool("configs", "--alter", "--entity-type", "topics")
    assert r.returncode == 1 and r.stderr.strip() == "Error: An entity name must be specified with --alter of topics"
    r = tool("configs", "--help", bootstrap=False)
    assert r.returncode == 0 and r.stdout.startswith("This tool helps to manipulate and describe entity config")


def test_user_scram_credentials(broker, tool):
    """kafka-configs.sh --entity-type users: SCRAM credentials made from a password, described
    with their iterations, deleted; checked with confluent-kafka's AdminClient."""
    from confluent_kafka.admin import ScramMechanism

    user = name("alice")
    r = tool("configs", "--alter", "--entity-type", "users", "--entity-name", user, "--add-config",
             "SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=alice-secret]")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"Completed updating config for user {user}.\n"
    r = tool("configs", "--describe", "--entity-type", "users", "--entity-name", user)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (f"SCRAM credential configs for user-principal '{user}' are "
                        "SCRAM-SHA-256=iterations=8192, SCRAM-SHA-512=iterations=4096\n")
    a = AdminClient({"bootstrap.servers": broker.bootstrap})
    d = a.describe_user_scram_credentials([user])[user].result(timeout=15)
    assert sorted((i.mechanism, i.iterations) for i in d.scram_credential_infos) == [
        (ScramMechanism.SCRAM_SHA_256, 8192), (ScramMechanism.SCRAM_SHA_512, 4096)]
    r = tool("configs", "--alter", "--entity-type", "users", "--entity-name", user,
             "--delete-config", "SCRAM-SHA-512")
    assert r.returncode == 0, r.stderr
    r = tool("configs", "--describe", "--entity-type", "users")
    assert f"SCRAM credential configs for user-principal '{user}' are SCRAM-SHA-256=iterations=8192\n" in r.stdout
    r = tool("configs", "--alter", "--entity-type", "users", "--entity-name", user,
             "--add-config", "SCRAM-SHA-256=[iterations=100,password=x]")
    assert r.returncode == 1 and "iterations" in r.stderr
    r = tool("configs", "--alter", "--entity-type", "users", "--entity-default",
             "--add-config", "SCRAM-SHA-256=[password=x]")
    assert r.returncode == 1 and "not allowed with User SCRAM Credentials" in r.stderr


def test_client_quotas(broker, tool):
    """kafka-configs.sh quotas: users, clients, a user's clients and defaults; the broker's
    answers (DescribeClientQuotas) printed as Kafka prints them; invalid values refused."""
    user, client = name("qu"), name("qc")
    r = tool("configs", "--alter", "--entity-type", "users", "--entity-name", user, "--entity-type", "clients",
             "--entity-default", "--add-config", "producer_byte_rate=1048576,request_percentage=50")
    assert r.returncode == 0, r.stderr
    r = tool("configs", "--alter", "--entity-type", "clients", "--entity-name", client,
             "--add-config", "consumer_byte_rate=2048")
    assert r.returncode == 0 and r.stdout == f"Completed updating config for client {client}.\n", r.stderr
    r = tool("configs", "--alter", "--entity-type", "clients", "--entity-default",
             "--add-config", "consumer_byte_rate=4096")
    assert r.stdout == "Completed updating default config for clients in the cluster.\n", r.stderr
    r = tool("configs", "--describe", "--entity-type", "users", "--entity-name", user, "--entity-type", "clients")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (f"Quota configs for user-principal '{user}', the default client-id are "
                        "producer_byte_rate=1048576.0, request_percentage=50.0\n")
    r = tool("configs", "--describe", "--entity-type", "clients", "--entity-name", client)
    assert r.stdout == f"Quota configs for client-id '{client}' are consumer_byte_rate=2048.0\n"
    r = tool("configs", "--describe", "--entity-type", "clients", "--entity-default")
    assert r.stdout == "Quota configs for the default client-id are consumer_byte_rate=4096.0\n"
    r = tool("configs", "--alter", "--entity-type", "clients", "--entity-name", client,
             "--add-config", "consumer_byte_rate=1.5")
    assert r.returncode == 1 and "consumer_byte_rate cannot be a fractional value" in r.stderr
    for args in (["--entity-type", "clients", "--entity-name", client],
                 ["--entity-type", "clients", "--entity-default"]):
        r = tool("configs", "--alter", *args, "--delete-config", "consumer_byte_rate")
        assert r.returncode == 0, r.stderr
    r = tool("configs", "--alter", "--entity-type", "users", "--entity-name", user, "--entity-type", "clients",
             "--entity-default", "--delete-config", "producer_byte_rate,request_percentage")
    assert r.returncode == 0, r.stderr
    r = tool("configs", "--describe", "--entity-type", "clients")
    assert client not in r.stdout and "the default client-id" not in r.stdout
