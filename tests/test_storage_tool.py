"""`kbroker storage` (like kafka-storage.sh) through the real CLI, the bootstrap.checkpoint it
writes, and `kbroker serve`'s start-up checks of a KRaft node's formatted storage."""
import io
import os
import re
import subprocess
import sys

import pytest

from kbroker.log.checkpoints import load_meta_properties, topic_id_from_str, write_meta_properties
from kbroker.metadata.bootstrap import (
    FormatterError,
    bootstrap_records,
    effective_feature_levels,
    encode_snapshot,
    metadata_version_from_string,
)
from kbroker.server.kraft_storage import read_bootstrap_file
from kbroker.metadata.records.feature_level_record import FeatureLevelRecord

CLUSTER = "MkU3OEVBNTcwNTJENDM2Qg"
UUID_RE = re.compile(r"[A-Za-z0-9_-]{22}")
TIMEOUT = 60


def kbroker(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "kbroker", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=cwd)


def storage_in_process(*args):
    """``kbroker storage`` in this process (for the many refusal cases; the real CLI is
    exercised by the other tests): a CompletedProcess-like result."""
    import contextlib
    from types import SimpleNamespace

    from kbroker.tools import storage

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = storage.main(list(args), out=out)
    return SimpleNamespace(returncode=rc, stdout=out.getvalue(), stderr=err.getvalue())


def write_config(tmp_path, roles="broker,controller", node_id=1, extra=""):
    voters = "1@127.0.0.1:19093" if "controller" in roles else "9@127.0.0.1:19093"
    listeners = {"broker,controller": "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093",
                 "controller": "CONTROLLER://127.0.0.1:19093",
                 "broker": "PLAINTEXT://127.0.0.1:19094"}[roles]
    p = tmp_path / f"node-{node_id}.properties"
    p.write_text(f"process.roles={roles}\nnode.id={node_id}\ncontroller.quorum.voters={voters}\n"
                 f"listeners={listeners}\ncontroller.listener.names=CONTROLLER\n"
                 f"log.dirs={tmp_path}/data-a,{tmp_path}/data-b\nmetadata.log.dir={tmp_path}/meta\n{extra}")
    return str(p)


def test_random_uuid_prints_a_kafka_uuid():
    r = kbroker("storage", "random-uuid")
    assert r.returncode == 0, r.stderr
    out = r.stdout.strip()
    assert UUID_RE.fullmatch(out) and not out.startswith("-")
    assert len(topic_id_from_str(out).bytes) == 16
    assert kbroker("storage", "random-uuid").stdout.strip() != out


def test_format_writes_meta_properties_and_bootstrap_in_every_dir(tmp_path):
    conf = write_config(tmp_path)
    r = kbroker("storage", "format", "--config", conf, "--cluster-id", CLUSTER)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"Formatting data directory {tmp_path}/data-a with metadata.version 3.9-IV0.",
        f"Formatting data directory {tmp_path}/data-b with metadata.version 3.9-IV0.",
        f"Formatting metadata directory {tmp_path}/meta with metadata.version 3.9-IV0.",
    ]
    dir_ids = set()
    for d in ("data-a", "data-b", "meta"):
        text = (tmp_path / d / "meta.properties").read_text()
        lines = text.splitlines()
        # java.util.Properties.store with an empty comment: "#", "#<date>", then the entries
        assert lines[0] == "#" and re.fullmatch(r"#\w{3} \w{3} \d\d \d\d:\d\d:\d\d UTC \d{4}", lines[1])
        assert lines[2:] == ["node.id=1", f"directory.id={lines[3].split('=')[1]}", "version=1",
                             f"cluster.id={CLUSTER}"]
        mp = load_meta_properties(str(tmp_path / d / "meta.properties"))
        assert (mp.version, mp.cluster_id, mp.node_id) == (1, CLUSTER, 1)
        dir_ids.add(mp.directory_id)
        records = read_bootstrap_file(str(tmp_path / d / "bootstrap.checkpoint"))
        assert [(r.message.name, r.message.feature_level, r.version) for r in records] == [
            ("metadata.version", 21, 0), ("transaction.version", 2, 0)]    # Kafka 4.0's default: TV 2
    assert len(dir_ids) == 3 and all(UUID_RE.fullmatch(i) for i in dir_ids)

    r = kbroker("storage", "info", "--config", conf)
    assert r.returncode == 0, r.stdout
    assert r.stdout.startswith(f"Found log directories:\n  {tmp_path}/data-a\n  {tmp_path}/data-b\n"
                               f"  {tmp_path}/meta\n\nFound metadata: {{cluster.id={CLUSTER}, directory.id=")
    assert "node.id=1, version=1}" in r.stdout


def test_reformat_is_refused_unless_ignore_formatted(tmp_path):
    conf = write_config(tmp_path)
    assert kbroker("storage", "format", "-c", conf, "-t", CLUSTER).returncode == 0
    before = (tmp_path / "meta" / "meta.properties").read_bytes()
    r = kbroker("storage", "format", "-c", conf, "-t", CLUSTER)
    assert r.returncode == 1
    assert r.stderr.strip() == (f"Log directory {tmp_path}/data-a is already formatted. Use --ignore-formatted "
                                "to ignore this directory and format the others.")
    r = kbroker("storage", "format", "-c", conf, "-t", CLUSTER, "--ignore-formatted")
    assert r.returncode == 0 and r.stdout.strip() == "All of the log directories are already formatted."
    assert (tmp_path / "meta" / "meta.properties").read_bytes() == before
    # a new log dir is formatted, the others are kept
    r = kbroker("storage", "format", "-c", conf, "-t", CLUSTER, "-g",
                "--override", f"log.dirs={tmp_path}/data-a,{tmp_path}/data-b,{tmp_path}/data-c")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"Formatting data directory {tmp_path}/data-c with metadata.version 3.9-IV0."]
    # another cluster's (or node's) directories are refused even with --ignore-formatted
    r = kbroker("storage", "format", "-c", conf, "-t", "AAAAAAAAAAAAAAAAAAAAAQ", "-g")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith(f"Invalid cluster.id in: {tmp_path}/data-a/meta.properties. "
                               f"Expected AAAAAAAAAAAAAAAAAAAAAQ, but read {CLUSTER}")
    r = kbroker("storage", "format", "-c", conf, "-t", CLUSTER, "-g", "--override", "node.id=2",
                "--override", "controller.quorum.voters=2@127.0.0.1:19093")
    assert r.returncode == 1 and r.stderr.startswith("Stored node id 1 doesn't match previous node id 2 in "
                                                     f"{tmp_path}/data-a/meta.properties.")


def test_format_options_and_refusals(tmp_path):
    conf = write_config(tmp_path)
    for args, message in (
            (["--release-version", "2.8"], "metadata.version 2.8 is too old to be supported."),
            (["--release-version", "3.1"], "Bootstrap metadata.version before 3.3-IV0 are not supported."),
            (["--release-version", "4.0-IV0"], "metadata.version 4.0-IV0 is not yet stable."),
            (["--release-version", "banana"], "Version banana is not a valid version"),
            (["--feature", "metadata.version=20", "--release-version", "3.8"], "Use --release-version instead"),
            (["--feature", "group.version=1"], "Unsupported feature: group.version. Supported features are: "
                                               "kraft.version, transaction.version"),
            (["--feature", "transaction.version=3"], "No feature:transaction.version with feature level 3"),
            (["--feature", "kraft.version=1"], "Cannot set kraft.version to 1 unless KIP-853"),
            (["--feature", "kraft.version"], "Can't parse feature=level string kraft.version"),
    ):
        r = storage_in_process("format", "-c", conf, "-t", CLUSTER, *args)
        assert r.returncode == 1, (args, r.stdout)
        assert r.stderr.startswith(message) and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
    assert not (tmp_path / "meta").exists()
    # zero-config configs are not formatted, and bad configs name their key
    plain = tmp_path / "plain.properties"
    plain.write_text(f"log.dirs={tmp_path}/plain\n")
    r = kbroker("storage", "format", "-c", str(plain), "-t", CLUSTER)
    assert r.returncode == 1 and "process.roles" in r.stderr
    r = kbroker("storage", "format", "-c", conf, "-t", CLUSTER, "--override", "node.id=7")
    assert r.returncode == 1 and r.stderr.startswith("controller.quorum.voters: ")
    # an older release, and a feature at a given level
    r = kbroker("storage", "format", "-c", conf, "-t", CLUSTER, "-r", "3.7", "-f", "kraft.version=0")
    assert r.returncode == 0, r.stderr
    assert "with metadata.version 3.7-IV4." in r.stdout
    assert not (tmp_path / "meta" / "__cluster_metadata-0").exists()     # static quorum: no voters snapshot
    records = read_bootstrap_file(str(tmp_path / "meta" / "bootstrap.checkpoint"))
    assert [r.message.feature_level for r in records] == [19]


def _dynamic_controller(tmp_path, node_id=1):
    conf = tmp_path / f"dyn-{node_id}.properties"
    conf.write_text(f"process.roles=controller\nnode.id={node_id}\n"
                    "controller.quorum.bootstrap.servers=127.0.0.1:19093,127.0.0.1:29093\n"
                    f"listeners=CONTROLLER://127.0.0.1:{node_id}9093\ncontroller.listener.names=CONTROLLER\n"
                    f"log.dirs={tmp_path}/meta-{node_id}\n")
    return str(conf)


def _voters_snapshot(meta_dir):
    from kbroker.kernels import records
    from kbroker.protocol.messages.kraft_version_record import KRaftVersionRecord
    from kbroker.protocol.messages.voters_record import VotersRecord

    data = (meta_dir / "__cluster_metadata-0" / "00000000000000000000-0000000000.checkpoint").read_bytes()
    batches = list(records.iter_batches(data))
    assert [(b.base_offset, b.is_control, b.record_count) for b in batches] == [(0, True, 3), (3, True, 1)]
    recs = batches[0].records
    assert [r.key for r in recs] == [b"\x00\x00\x00\x03", b"\x00\x00\x00\x05", b"\x00\x00\x00\x06"]
    assert KRaftVersionRecord.decode(recs[1].value, 0).kraft_version == 1
    return VotersRecord.decode(recs[2].value, 0)


def test_kip853_dynamic_quorum_format(tmp_path):
    """A controller with controller.quorum.bootstrap.servers only: one of --standalone,
    --initial-controllers or --no-initial-controllers is required (Kafka 3.9's safeguard)."""
    conf = _dynamic_controller(tmp_path)
    r = kbroker("storage", "format", "-c", conf, "-t", CLUSTER)
    assert r.returncode == 1 and r.stderr.strip() == (
        "Because controller.quorum.voters is not set on this controller, you must specify one of the following: "
        "--standalone, --initial-controllers, or --no-initial-controllers.")
    r = storage_in_process("format", "-c", conf, "-t", CLUSTER, "--standalone", "-f", "kraft.version=0")
    assert r.returncode == 1 and r.stderr.startswith("Cannot set kraft.version to 0 if KIP-853 configuration")
    r = storage_in_process("format", "-c", conf, "-t", CLUSTER, "--standalone", "-r", "3.8")
    assert r.returncode == 1 and r.stderr.startswith("kraft.version could not be set to 1 because it depends on "
                                                     "metadata.version level 21")
    r = kbroker("storage", "format", "-c", conf, "-t", CLUSTER, "--standalone")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (f"Formatting dynamic metadata voter directory {tmp_path}/meta-1 with "
                                "metadata.version 3.9-IV0.")
    voters = _voters_snapshot(tmp_path / "meta-1")
    mp = load_meta_properties(str(tmp_path / "meta-1" / "meta.properties"))
    [v] = voters.voters
    assert (v.voter_id, [(e.name, e.host, e.port) for e in v.endpoints]) == (1, [("CONTROLLER", "127.0.0.1", 19093)])
    assert (v.kraft_version_feature.min_supported_version, v.kraft_version_feature.max_supported_version) == (0, 1)
    assert topic_id_from_str(mp.directory_id) == v.voter_directory_id      # the voter's own directory

    # --initial-controllers: the voter's directory takes the id given for it; a non-voter's does not
    initial = "1@127.0.0.1:19093:J8aAPcfLQt2bqs1JT_rMgQ,2@127.0.0.1:29093:a6e4EJ2tEdGAtADAT9QwyA"
    conf2 = _dynamic_controller(tmp_path, node_id=2)
    r = kbroker("storage", "format", "-c", conf2, "-t", CLUSTER, "--initial-controllers", initial)
    assert r.returncode == 0, r.stderr
    assert load_meta_properties(str(tmp_path / "meta-2" / "meta.properties")).directory_id == "a6e4EJ2tEdGAtADAT9QwyA"
    assert [x.voter_id for x in _voters_snapshot(tmp_path / "meta-2").voters] == [1, 2]
    conf3 = _dynamic_controller(tmp_path, node_id=3)
    r = kbroker("storage", "format", "-c", conf3, "-t", CLUSTER, "-I", initial)
    assert r.returncode == 0 and "Formatting dynamic metadata directory" in r.stdout
    assert load_meta_properties(str(tmp_path / "meta-3" / "meta.properties")).directory_id not in (
        "J8aAPcfLQt2bqs1JT_rMgQ", "a6e4EJ2tEdGAtADAT9QwyA")
    for bad, message in (("1-127.0.0.1:19093:J8aAPcfLQt2bqs1JT_rMgQ", "No @ found in dynamic voter string."),
                         ("1@127.0.0.1:19093", "No colon following port could be found."),
                         ("1@127.0.0.1:19093:nope", "Failed to parse directory ID in dynamic voter string."),
                         (initial + ",1@h:1:J8aAPcfLQt2bqs1JT_rMgQ", "Node id 1 was specified more than once.")):
        r = storage_in_process("format", "-c", _dynamic_controller(tmp_path, node_id=4), "-t", CLUSTER, "-I", bad)
        assert (r.returncode, r.stderr.strip()) == (1, message)
    # a controller that will be added later, and a broker, need no topology
    r = kbroker("storage", "format", "-c", conf3, "-t", CLUSTER, "-N",
                "--override", f"log.dirs={tmp_path}/meta-later")
    assert r.returncode == 0 and not (tmp_path / "meta-later" / "__cluster_metadata-0").exists()
    r = kbroker("storage", "format", "-c", write_config(tmp_path, roles="broker", node_id=4), "-t", CLUSTER,
                "--standalone")
    assert (r.returncode, r.stderr.strip()) == (1, "You can only use --standalone on a controller.")


def test_info_reports_problems(tmp_path):
    conf = write_config(tmp_path)
    r = kbroker("storage", "info", "-c", conf)
    assert r.returncode == 1
    assert r.stdout == (f"Found problems:\n  {tmp_path}/data-a does not exist\n  {tmp_path}/data-b does not exist\n"
                        f"  {tmp_path}/meta does not exist\n\n")
    (tmp_path / "data-a").mkdir()
    write_meta_properties(str(tmp_path / "data-a" / "meta.properties"), node_id=1, cluster_id="other",
                          directory_id="J8aAPcfLQt2bqs1JT_rMgQ")
    assert kbroker("storage", "format", "-c", conf, "-t", "other", "-g").returncode == 0
    with open(tmp_path / "data-b" / "meta.properties", "w") as f:
        f.write("version=1\ncluster.id=x\nnode.id=1\n")
    r = kbroker("storage", "info", "-c", conf)
    assert r.returncode == 1 and "Found problem:\n  Mismatched cluster IDs between storage directories.\n" in r.stdout


def test_bootstrap_checkpoint_bytes_follow_kafkas_batch_file_writer():
    """Header control batch at offset 0, one data batch, footer control batch; epoch 0."""
    from kbroker.kernels import records

    # transaction.version 0: no record of its own, one data record in the file
    mv, levels = effective_feature_levels(metadata_version_from_string("3.9"), {"transaction.version": 0})
    data = encode_snapshot(bootstrap_records(mv, levels), now_ms=1_700_000_000_000)
    batches = list(records.iter_batches(data))
    assert [(b.base_offset, b.is_control, b.partition_leader_epoch, b.record_count) for b in batches] == [
        (0, True, 0, 1), (1, False, 0, 1), (2, True, 0, 1)]
    assert all(b.is_valid() and b.max_timestamp == 1_700_000_000_000 and b.producer_id == -1 for b in batches)
    header, body, footer = (b.records[0] for b in batches)
    assert header.key == b"\x00\x00\x00\x03" and header.value == b"\x00\x00" + b"\x00" * 8 + b"\x00"
    assert footer.key == b"\x00\x00\x00\x04" and footer.value == b"\x00\x00\x00"
    # frame version 1, apiKey 12 (FeatureLevelRecord), version 0, then the compact-string body
    assert body.key is None and body.value == b"\x01\x0c\x00\x11metadata.version\x00\x15\x00"
    with pytest.raises(FormatterError):
        effective_feature_levels(metadata_version_from_string("4.0-IV1"), {})
    assert isinstance(bootstrap_records(mv, levels)[0].message, FeatureLevelRecord)


# -- kbroker serve in cluster mode ------------------------------------------------------------

def serve(conf, *overrides):
    args = ["serve", "--config", conf]
    for o in overrides:
        args += ["--override", o]
    r = kbroker(*args)
    assert r.returncode != 0
    errors = [l for l in r.stderr.splitlines() if l.startswith("kbroker: error: ")]
    assert len(errors) == 1, r.stderr
    return errors[0]


def test_serve_refuses_unformatted_and_foreign_storage(tmp_path):
    conf = write_config(tmp_path)
    err = serve(conf)
    assert err.startswith("kbroker: error: cannot start: No readable meta.properties files found")
    assert not (tmp_path / "data-a").exists()            # cluster mode never formats itself
    assert kbroker("storage", "format", "-c", conf, "-t", CLUSTER).returncode == 0
    # (a formatted node starts: tests/cluster/test_kraft_cluster.py runs such nodes)
    # a log dir added to the config but not formatted
    err = serve(conf, f"log.dirs={tmp_path}/data-a,{tmp_path}/data-new")
    assert err == (f"kbroker: error: cannot start: No `meta.properties` found in {tmp_path}/data-new (have you run "
                   "`kbroker storage format` to format the directory?)")
    # another node's directories
    err = serve(conf, "node.id=2", "controller.quorum.voters=2@127.0.0.1:19093")
    assert err.startswith(f"kbroker: error: cannot start: Stored node id 1 doesn't match previous node id 2 in "
                          f"{tmp_path}/data-a/meta.properties")
    # another cluster's directory among ours
    (tmp_path / "data-other").mkdir()
    write_meta_properties(str(tmp_path / "data-other" / "meta.properties"), node_id=1,
                          cluster_id="AAAAAAAAAAAAAAAAAAAAAQ", directory_id="J8aAPcfLQt2bqs1JT_rMgQ")
    err = serve(conf, f"log.dirs={tmp_path}/data-a,{tmp_path}/data-other")
    assert err.startswith(f"kbroker: error: cannot start: Invalid cluster.id in: {tmp_path}/data-other/"
                          f"meta.properties. Expected {CLUSTER}, but read AAAAAAAAAAAAAAAAAAAAAQ")
    # a ZooKeeper-mode (version 0) meta.properties
    (tmp_path / "data-zk").mkdir()
    (tmp_path / "data-zk" / "meta.properties").write_text(f"#\nversion=0\nbroker.id=1\ncluster.id={CLUSTER}\n")
    err = serve(conf, f"log.dirs={tmp_path}/data-a,{tmp_path}/data-zk")
    assert err.startswith(f"kbroker: error: cannot start: {tmp_path}/data-zk/meta.properties is a version 0")


def test_serve_without_process_roles_still_formats_itself(tmp_path):
    """Zero-config mode is unchanged: no format step, meta.properties written on first start."""
    from kbroker.testing import KBrokerProcess

    (tmp_path / "zc").mkdir()
    with KBrokerProcess(data_dir=str(tmp_path / "zc")).start() as b:
        assert b.port
    mp = load_meta_properties(str(tmp_path / "zc" / "logs" / "meta.properties"))
    assert mp.version == 1 and mp.node_id == 1 and UUID_RE.fullmatch(mp.cluster_id)


# -- the sample configs in config/kraft/ ------------------------------------------------------

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config", "kraft")
SAMPLE_NAMES = [f"combined-{n}" for n in (1, 2, 3)] + [f"controller-{n}" for n in (1, 2, 3)] + [
    f"broker-{n}" for n in (4, 5, 6)]


def test_sample_configs_form_two_consistent_clusters():
    from kbroker.server.config import KafkaConfig

    assert sorted(f[:-len(".properties")] for f in os.listdir(SAMPLES)) == sorted(SAMPLE_NAMES)
    configs = {n: KafkaConfig.from_sources(os.path.join(SAMPLES, n + ".properties")) for n in SAMPLE_NAMES}
    ports = {}
    for name, c in configs.items():
        assert c.cluster_mode and c.log_dirs == [f"./kbroker-cluster/{name}"]
        for l in c.listeners:
            assert ports.setdefault((name.split("-")[0] == "combined", l.port), name) == name, (name, l.port)
    voters = {n: c.voters for n, c in configs.items()}
    assert len({tuple(sorted(v.items())) for v in voters.values()}) == 1      # one quorum for all
    for n in (1, 2, 3):
        for kind in ("combined", "controller"):
            c = configs[f"{kind}-{n}"]
            assert c.voters[n][1] in {l.port for l in c.controller_listeners}
    assert {configs[f"broker-{n}"].node_id for n in (4, 5, 6)} == {4, 5, 6}


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_sample_config_formats(tmp_path, name):
    from kbroker.tools import storage

    out = io.StringIO()
    rc = storage.main(["format", "--config", os.path.join(SAMPLES, name + ".properties"), "--cluster-id", CLUSTER,
                       "--override", f"log.dirs={tmp_path}/data"], out=out)
    assert rc == 0
    assert out.getvalue() == f"Formatting metadata directory {tmp_path}/data with metadata.version 3.9-IV0.\n"
    mp = load_meta_properties(str(tmp_path / "data" / "meta.properties"))
    assert mp.cluster_id == CLUSTER and mp.node_id == int(name.split("-")[1])
    assert (tmp_path / "data" / "bootstrap.checkpoint").exists()


def test_format_add_scram_writes_credentials_into_the_bootstrap_metadata(tmp_path):
    """kafka-storage.sh's --add-scram: one UserScramCredentialRecord per argument after the
    feature levels (keys derived from the password, or from a given salt and salted password)."""
    import base64

    from kbroker.metadata.records.user_scram_credential_record import UserScramCredentialRecord
    from kbroker.security import scram

    conf = write_config(tmp_path)
    salt, salted = b"1lv4pdnw4fwq7notcxm0yy1k7q", bytes(range(32))
    r = kbroker("storage", "format", "-c", conf, "-t", CLUSTER,
                "--add-scram", "SCRAM-SHA-256=[name=alice,password=alice-secret]",
                "-S", f'SCRAM-SHA-512=[name=bob,iterations=8192,salt="{base64.b64encode(salt).decode()}",'
                      f'saltedpassword="{base64.b64encode(salted).decode()}"]')
    assert r.returncode == 0, r.stderr
    for d in ("data-a", "meta"):
        records = read_bootstrap_file(str(tmp_path / d / "bootstrap.checkpoint"))
        # metadata.version and transaction.version, then the credentials
        assert [type(x.message) for x in records] == [FeatureLevelRecord, FeatureLevelRecord,
                                                     UserScramCredentialRecord, UserScramCredentialRecord]
        assert [x.message.name for x in records[:2]] == ["metadata.version", "transaction.version"]
        alice, bob = records[2].message, records[3].message
        assert (alice.name, alice.mechanism, alice.iterations, len(alice.salt)) == ("alice", 1, 4096, 32)
        want = scram.make_credential("SCRAM-SHA-256", "alice-secret", 4096, bytes(alice.salt))
        assert (bytes(alice.stored_key), bytes(alice.server_key)) == (want.stored_key, want.server_key)
        want = scram.credential_from_salted("SCRAM-SHA-512", salted, salt, 8192)
        assert (bob.name, bob.mechanism, bob.iterations, bytes(bob.salt), bytes(bob.stored_key),
                bytes(bob.server_key)) == ("bob", 2, 8192, salt, want.stored_key, want.server_key)


def test_format_add_scram_refusals(tmp_path):
    """Kafka's ScramParser / Formatter messages, one line, exit code 1, nothing written."""
    conf = write_config(tmp_path)
    ok = "SCRAM-SHA-256=[name=alice,password=alice-secret]"
    for args, message in (
            (["-S", ok, "--release-version", "3.5-IV1"], "SCRAM is only supported in metadata.version 3.5-IV2 or later."),
            (["-S", "SCRAM-SHA-512"], "Failed to find equals sign in SCRAM argument 'SCRAM-SHA-512'"),
            (["-S", "SCRAM-SHA-UNSUPPORTED=[name=alice]"], "The add-scram mechanism SCRAM-SHA-UNSUPPORTED is not supported."),
            (["-S", "SCRAM-SHA-256=name=alice]"], "Expected configuration string to start with ["),
            (["-S", "SCRAM-SHA-256=[name=alice"], "Expected configuration string to end with ]"),
            (["-S", "SCRAM-SHA-256=[password=x]"], "You must supply 'name' to add-scram"),
            (["-S", "SCRAM-SHA-256=[name=alice]"], "You must supply one of 'password' or 'saltedpassword' to add-scram"),
            (["-S", "SCRAM-SHA-256=[name=alice,saltedpassword=YCE=]"], "You must supply 'salt' with 'saltedpassword' "
                                                                       "to add-scram"),
            (["-S", "SCRAM-SHA-256=[name=alice,password=x,unknown=1,unknown2=2]"],
             "Unknown SCRAM configurations: unknown, unknown2"),
            (["-S", "SCRAM-SHA-256=[name]"], "No equals sign found in SCRAM component: name"),
            (["-S", "SCRAM-SHA-256=[name=a,password=x,iterations=4095]"],
             "The 'iterations' value must be >= 4096 for add-scram using SCRAM_SHA_256"),
            (["-S", "SCRAM-SHA-512=[name=a,password=x,iterations=16385]"],
             "The 'iterations' value must be <= 16384 for add-scram using SCRAM_SHA_512"),
            (["-S", "SCRAM-SHA-256=[name=a,password=x,iterations=lots]"], "Failed to parse iterations count: lots"),
            (["-S", "SCRAM-SHA-256=[name=a,password=x,salt=@@]"], "Failed to decode given salt: @@"),
            (["-S", "SCRAM-SHA-256=[name=a,salt=N3E=,saltedpassword=%%]"], "Failed to decode given saltedPassword: %%"),
    ):
        r = storage_in_process("format", "-c", conf, "-t", CLUSTER, *args)
        assert r.returncode == 1, (args, r.stdout)
        assert r.stderr.strip() == message, (args, r.stderr)
    assert not (tmp_path / "meta").exists()
