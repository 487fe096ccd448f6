"""The queue checker finds each kind of violation in a made-up history, and passes a good one."""
from kbroker.chaos.checker import FAILED, OK, UNKNOWN, Send, check


def _good():
    sends = [Send(0, 0, b"0:0", 0, OK, 0), Send(0, 1, b"0:1", 0, OK, 1), Send(1, 0, b"1:0", 1, OK, 0),
             Send(1, 1, b"1:1", 0, UNKNOWN), Send(1, 2, b"1:2", 1, FAILED)]
    reads = {0: [(0, b"0:0"), (1, b"0:1"), (2, b"1:1")], 1: [(0, b"1:0")]}
    return sends, reads


def test_a_good_history_passes_with_unknown_and_failed_sends_allowed():
    sends, reads = _good()
    v = check(sends, reads)
    assert v.ok, v.summary()
    assert (v.sends, v.acknowledged, v.read) == (5, 3, 4)
    reads[1].append((1, b"1:2"))          # a failed send that was written after all: allowed
    assert check(sends, reads).ok


def test_each_violation_is_found():
    sends, reads = _good()
    lost = {0: reads[0][:1] + reads[0][2:], 1: reads[1]}
    assert [x[2] for x in check(sends, lost).lost] == [b"0:1"]
    moved = {0: [(0, b"0:0"), (5, b"0:1")], 1: reads[1]}
    assert check(sends, moved).reassigned and not check(sends, moved).lost
    dup = {0: reads[0] + [(3, b"0:0")], 1: reads[1]}
    v = check(sends, dup)
    assert v.duplicated and not v.ok
    swapped = {0: [(0, b"0:1"), (1, b"0:0")], 1: reads[1]}
    v = check([Send(0, 0, b"0:0", 0, UNKNOWN), Send(0, 1, b"0:1", 0, UNKNOWN), sends[2]], swapped)
    assert v.reordered and not v.lost
    stranger = {0: reads[0] + [(3, b"9:9")], 1: reads[1]}
    assert check(sends, stranger).unexpected
    backwards = {0: [(1, b"0:1"), (0, b"0:0")], 1: reads[1]}
    assert check(sends, backwards).offsets
