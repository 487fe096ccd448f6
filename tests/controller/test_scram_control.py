"""ScramControlManager: AlterUserScramCredentials validated as Kafka's controller does
(AlterUserScramCredentialsRequestTest's cases), written as UserScramCredentialRecords /
RemoveUserScramCredentialRecords, replayed into the controller and a broker's image alike,
kept in snapshots; the image is what SASL and DescribeUserScramCredentials read."""
from __future__ import annotations

import pytest

from kbroker.controller import QuorumController
from kbroker.controller.features import IBP_3_5_IV2
from kbroker.metadata import records as R
from kbroker.metadata.delta import MetadataDelta, image_delta, replay_all
from kbroker.metadata.image import MetadataImage
from kbroker.protocol.errors import ErrorCode as E
from kbroker.protocol.messages import alter_user_scram_credentials as A
from kbroker.security import scram
from kbroker.security.credentials import PublishedScramCredentials

from tests.controller.harness import Harness

SHA256, SHA512, UNKNOWN = 1, 2, 0
SALT = b"salt"
SALTED = b"saltedPassword"


def up(name, mech=SHA256, iterations=4096, salted=SALTED):
    return A.ScramCredentialUpsertion(name=name, mechanism=mech, iterations=iterations, salt=SALT,
                                      salted_password=salted)


def dele(name, mech=SHA256):
    return A.ScramCredentialDeletion(name=name, mechanism=mech)


def alter(h, deletions=(), upsertions=()):
    return h.write(h.c.alter_user_scram_credentials(A.AlterUserScramCredentialsRequest(
        deletions=list(deletions), upsertions=list(upsertions))))


def results(r):
    return sorted((x.user, x.error_code, x.error_message) for x in r.response.results)


def test_upsert_and_delete_replay_to_the_same_image_and_survive_a_snapshot():
    h = Harness()
    r = alter(h, upsertions=[up("user1"), up("user2", SHA512, 8192), up("user3@user3.com", SHA512, 8192)])
    assert results(r) == [("user1", 0, None), ("user2", 0, None), ("user3@user3.com", 0, None)]
    assert r.atomic and [type(x.message) for x in r.records] == [R.UserScramCredentialRecord] * 3
    rec = r.records[0].message
    # the stored and server keys are derived from the salted password: it never reaches the log
    want = scram.credential_from_salted("SCRAM-SHA-256", SALTED, SALT, 4096)
    assert (rec.salt, rec.stored_key, rec.server_key, rec.iterations) == (
        want.salt, want.stored_key, want.server_key, 4096)
    assert SALTED not in r.records[0].message.encode(0)
    r = alter(h, upsertions=[up("user1", SHA512, 8192)])
    assert results(r) == [("user1", 0, None)]
    image = h.broker_image()
    assert image.same_state(h.c.image()) and h.replayed().state() == h.c.state()
    assert image.scram.scram_credential("user1", "SCRAM-SHA-256") == want
    assert image.scram.scram_credential("user1", "SCRAM-SHA-1") is None
    assert {u: {m: c.iterations for m, c in ms.items()} for u, ms in image.scram.scram_credentials().items()} == {
        "user1": {"SCRAM-SHA-256": 4096, "SCRAM-SHA-512": 8192}, "user2": {"SCRAM-SHA-512": 8192},
        "user3@user3.com": {"SCRAM-SHA-512": 8192}}
    # a snapshot of the image keeps the credentials, and a controller loaded from it has them
    snap = image.to_records()
    assert replay_all(snap).scram == image.scram
    loaded = QuorumController.from_snapshot(snap, image.offset, h.config)
    assert loaded.scram.credentials == h.c.scram.credentials

    r = alter(h, deletions=[dele("user1", SHA512), dele("user2", SHA512)])
    assert results(r) == [("user1", 0, None), ("user2", 0, None)]
    assert [type(x.message) for x in r.records] == [R.RemoveUserScramCredentialRecord] * 2
    image = h.broker_image()
    assert image.same_state(h.c.image()) and h.replayed().state() == h.c.state()
    assert set(image.scram.scram_credentials()) == {"user1", "user3@user3.com"}
    assert image.scram.scram_credential("user2", "SCRAM-SHA-512") is None


def test_the_same_user_twice_in_one_request_is_a_duplicate_whatever_the_mechanisms():
    h = Harness()
    alter(h, upsertions=[up("user1"), up("user2")])
    for dels, ups in (([dele("user1"), dele("user1")], [up("user2"), up("user2")]),
                      ([dele("user1"), dele("user2")], [up("user1"), up("user2")]),
                      ([], [up("user1", SHA256), up("user1", SHA512), up("user2")])):
        r = alter(h, dels, ups)
        dup = [x for x in r.response.results if x.error_code]
        assert {x.user for x in dup} == {"user1", "user2"} if len(dels) else {"user1"}
        assert all((x.error_code, x.error_message) == (
            E.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request") for x in dup)
        assert len(r.response.results) == len({x.name for x in dels + ups})
    # only the last request's user2 was written (again): user1's SCRAM-SHA-512 never was
    assert len(r.records) == 1 and set(h.c.scram.credentials) == {("user1", SHA256), ("user2", SHA256)}


def test_refusals_carry_kafkas_codes_and_texts():
    h = Harness()
    r = alter(h, [dele(""), dele("")], [up("")])
    assert results(r) == [("", E.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")]
    r = alter(h, [dele("user1", UNKNOWN), dele("user1"), dele("user2", 10)],
              [up("user4", UNKNOWN, 8192), up("user4", SHA256, 8192), up("user5", 10, 8192), up("user6", UNKNOWN)])
    assert results(r) == [(u, E.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
                          for u in ("user1", "user2", "user4", "user5", "user6")]
    r = alter(h, upsertions=[up("user1", iterations=1), up("user2", iterations=2**31 - 1),
                             up("user3", iterations=4095), up("user4", iterations=16385),
                             up("user5", iterations=4096), up("user6", iterations=16384)])
    assert results(r) == [("user1", E.UNACCEPTABLE_CREDENTIAL, "Too few iterations"),
                          ("user2", E.UNACCEPTABLE_CREDENTIAL, "Too many iterations"),
                          ("user3", E.UNACCEPTABLE_CREDENTIAL, "Too few iterations"),
                          ("user4", E.UNACCEPTABLE_CREDENTIAL, "Too many iterations"),
                          ("user5", 0, None), ("user6", 0, None)]
    assert len(r.records) == 2                      # the valid ones are written, the rest refused
    r = alter(h, deletions=[dele("user5", SHA512), dele("nobody")])
    assert results(r) == [(u, E.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist")
                          for u in ("nobody", "user5")]
    assert not r.records
    r = alter(h)
    assert r.response.results == [] and not r.records
    # the result order: deletions, upsertions, then errors
    r = alter(h, [dele("user6")], [up("new"), up("")])
    assert [x.user for x in r.response.results] == ["user6", "new", ""]


def test_metadata_version_before_3_5_iv2_does_not_support_scram():
    h = Harness(metadata_version=IBP_3_5_IV2 - 1)
    r = alter(h, [dele("a")], [up("b")])
    assert results(r) == [(u, E.UNSUPPORTED_VERSION, "The current metadata.version does not support SCRAM")
                          for u in ("a", "b")]
    assert not r.records
    h = Harness(metadata_version=IBP_3_5_IV2)
    assert results(alter(h, upsertions=[up("b")])) == [("b", 0, None)]


def test_replay_of_a_removal_the_controller_does_not_have_is_an_error_the_image_ignores():
    rm = R.RemoveUserScramCredentialRecord(name="ghost", mechanism=SHA256)
    with pytest.raises(ValueError):
        QuorumController().replay(rm, 0)
    d = MetadataDelta(MetadataImage())
    d.replay(rm, 0)                                 # Kafka's ScramDelta: nothing to remove
    assert d.scram_changed() and d.apply().scram.credentials == {}


def test_snapshot_load_delta_and_published_credentials():
    h = Harness()
    alter(h, upsertions=[up("alice", SHA512)])
    before = h.broker_image()
    alter(h, [dele("alice", SHA512)], [up("bob")])
    after = h.broker_image()
    d = image_delta(before, after)                  # what a node publishes when a snapshot replaces its image
    assert d.scram_changed() and d.apply().scram == after.scram
    assert not image_delta(after, after).scram_changed()
    src = PublishedScramCredentials()
    assert src.scram_credential("bob", "SCRAM-SHA-256") is None and src.scram_credentials() == {}
    src.update(before.scram)
    assert src.scram_credential("alice", "SCRAM-SHA-512") is not None
    src.update(after.scram)
    assert src.scram_credential("alice", "SCRAM-SHA-512") is None
    assert set(src.scram_credentials()) == {"bob"}
