"""PrefixIndex: prefix-match queries, LRU bounds, precise vs approximate, predictions, retirement."""

from __future__ import annotations

import pytest

from litellm_disagg.routing.kv.prefix_index import PrefixIndex


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def H(*ids: int) -> list[int]:
    """Readable stand-ins for block hashes."""
    return list(ids)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def index(clock: Clock) -> PrefixIndex:
    idx = PrefixIndex(predicted_ttl_s=5.0, clock=clock)
    idx.add_worker("a", capacity_blocks=100)
    idx.add_worker("b", capacity_blocks=100)
    idx.add_worker("c", capacity_blocks=100)
    return idx


@pytest.mark.parametrize(
    ("held", "query", "expected"),
    [
        ({"a": H(1, 2, 3)}, H(1, 2, 3, 4), {"a": 3}),
        ({"a": H(1, 2, 3), "b": H(1, 2)}, H(1, 2, 3), {"a": 3, "b": 2}),
        ({"a": H(1, 3)}, H(1, 2, 3), {"a": 1}),  # stops at the first missing block
        ({"a": H(2, 3)}, H(1, 2, 3), {}),  # no first block, no overlap
        ({"a": H(1, 2), "b": H(1, 2), "c": H(9)}, H(1, 2), {"a": 2, "b": 2}),
        ({}, H(1), {}),
        ({"a": H(1)}, H(), {}),
    ],
)
def test_overlap_is_a_prefix_match(
    index: PrefixIndex, held: dict[str, list[int]], query: list[int], expected: dict[str, int]
) -> None:
    for worker, hashes in held.items():
        index.stored(worker, hashes)
    assert index.overlap(query) == expected


def test_removed_and_cleared(index: PrefixIndex) -> None:
    index.stored("a", H(1, 2, 3))
    index.stored("b", H(1, 2, 3))
    index.removed("a", H(2))
    assert index.overlap(H(1, 2, 3)) == {"a": 1, "b": 3}
    index.cleared("b")
    assert index.overlap(H(1, 2, 3)) == {"a": 1}
    index.stored("b", H(1))  # a cleared worker fills again
    assert index.overlap(H(1, 2, 3)) == {"a": 1, "b": 1}
    assert index.blocks("b") == 1


def test_unknown_workers_and_blocks_are_ignored(index: PrefixIndex) -> None:
    index.stored("nobody", H(1))
    index.removed("a", H(42))
    index.cleared("nobody")
    index.remove_worker("nobody")
    assert index.overlap(H(1)) == {}


def test_remove_worker_takes_effect_at_once_and_releases_later(index: PrefixIndex) -> None:
    index.stored("a", list(range(1, 51)))
    index.stored("b", H(1, 2))
    index.remove_worker("a")
    assert index.overlap(list(range(1, 51))) == {"b": 2}
    assert index.stats().pending_release == 50
    released = index.maintain(max_items=20)
    assert released == 20 and index.stats().pending_release == 30
    index.maintain()
    stats = index.stats()
    assert stats.pending_release == 0 and stats.distinct_blocks == 2 and stats.workers == 2
    index.add_worker("a", capacity_blocks=10)  # the freed slot is reused, clean
    assert index.overlap(list(range(1, 51))) == {"b": 2}


def test_lru_bound_evicts_least_recently_stored(clock: Clock) -> None:
    index = PrefixIndex(clock=clock)
    index.add_worker("a", capacity_blocks=3)
    index.stored("a", H(1, 2, 3))
    index.stored("a", H(1))  # touch 1: now 2 is the oldest
    index.stored("a", H(4))
    assert not index.holds("a", 2)
    assert all(index.holds("a", h) for h in (1, 3, 4))
    index.add_worker("a", capacity_blocks=1)  # shrinking evicts at once
    assert index.blocks("a") == 1 and index.holds("a", 4)


def test_approximate_entries_expire(clock: Clock) -> None:
    index = PrefixIndex(clock=clock)
    index.add_worker("a", capacity_blocks=10, ttl_s=60.0)
    index.record_routed("a", H(1, 2))
    clock.now += 30
    index.record_routed("a", H(1))  # used again: lives on
    clock.now += 40
    index.maintain()
    assert index.overlap(H(1, 2)) == {"a": 1}
    assert not index.is_precise("a")
    clock.now += 31
    index.maintain()
    assert index.overlap(H(1, 2)) == {}


def test_prediction_covers_the_gap_until_block_stored(index: PrefixIndex, clock: Clock) -> None:
    index.record_routed("a", H(1, 2, 3))  # precise worker: a prediction
    assert index.overlap(H(1, 2, 3)) == {"a": 3}  # the sibling sees it
    assert index.blocks("a") == 0 and index.stats().predicted_blocks == 3
    index.stored("a", H(1, 2))  # the events replace the prediction
    assert index.stats().predicted_blocks == 1
    assert index.overlap(H(1, 2, 3)) == {"a": 3}
    clock.now += 6
    index.maintain()
    assert index.overlap(H(1, 2, 3)) == {"a": 2}
    assert index.stats().predicted_blocks == 0


def test_prediction_and_held_blocks_combine_in_one_prefix(index: PrefixIndex) -> None:
    index.stored("a", H(1, 2))
    index.record_routed("a", H(1, 2, 3, 4))  # only 3, 4 are predicted
    assert index.stats().predicted_blocks == 2
    assert index.overlap(H(1, 2, 3, 4, 5)) == {"a": 4}


def test_renewed_prediction_survives_the_first_expiry(index: PrefixIndex, clock: Clock) -> None:
    index.record_routed("a", H(1))
    clock.now += 3
    index.record_routed("a", H(1))  # 1 is predicted again, until now + 5
    clock.now += 3
    index.maintain()
    assert index.overlap(H(1)) == {"a": 1}
    clock.now += 3
    index.maintain()
    assert index.overlap(H(1)) == {}


def test_cleared_drops_predictions_too(index: PrefixIndex) -> None:
    index.record_routed("a", H(1))
    index.cleared("a")
    assert index.overlap(H(1)) == {}
    index.maintain()
    assert index.stats().predicted_blocks == 0 and index.stats().pending_release == 0


def test_many_workers_beyond_64_slots(clock: Clock) -> None:
    index = PrefixIndex(clock=clock)
    for w in range(130):
        index.add_worker(f"w{w}", capacity_blocks=10)
        index.stored(f"w{w}", list(range(w % 5 + 1)))
    result = index.overlap([0, 1, 2, 3, 4])
    assert len(result) == 130
    assert result["w129"] == 129 % 5 + 1 and result["w0"] == 1


def test_invalid_arguments(clock: Clock) -> None:
    with pytest.raises(ValueError):
        PrefixIndex(predicted_ttl_s=0)
    index = PrefixIndex(clock=clock)
    with pytest.raises(ValueError):
        index.add_worker("a", capacity_blocks=0)
    with pytest.raises(ValueError):
        index.add_worker("a", capacity_blocks=1, ttl_s=0)


def test_routing_to_a_precise_worker_refreshes_its_held_blocks(clock: Clock) -> None:
    index = PrefixIndex(clock=clock)
    index.add_worker("a", capacity_blocks=3)
    index.stored("a", H(1, 2, 3))
    index.record_routed("a", H(1))  # a request uses block 1: it is no longer the oldest
    index.stored("a", H(4))
    assert index.holds("a", 1) and not index.holds("a", 2)
