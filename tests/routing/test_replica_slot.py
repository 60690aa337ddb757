"""Ties split between proxy replicas (``routing/replica_slot.py`` and the picker): replicas that see the same tie at
the same moment pick different workers, where a random draw (or a rotation starting at the same place) would send
several to one."""

import itertools
import random

from litellm_disagg.routing.accounting import Accounting
from litellm_disagg.routing.pipeline.pipeline import Pipeline
from litellm_disagg.routing.pipeline.profile import PICKER_PROFILES, ProfileSettings
from litellm_disagg.routing.pipeline.providers import LoadProvider
from litellm_disagg.routing.replica_slot import ReplicaSlot, offset, share, slot_of

from ..test_routing_units import w

KV_LIKE = ProfileSettings(weights={"load": 1.0})  # ties broken on load, then at random (the KV profiles' way)


def test_a_replicas_slot_is_its_rank_among_the_live_ids():
    assert slot_of("a", []) is None and slot_of("a", ["a"]) is None  # alone
    assert slot_of("b", ["c", "a"]) == ReplicaSlot(1, 3)
    assert slot_of("c", ["a", "b", "b", "c"]) == ReplicaSlot(2, 3)  # a repeated or own id counts once
    ids = ["r-9", "r-1", "r-5", "r-3"]
    ranks = {me: slot_of(me, [x for x in ids if x != me]).rank for me in ids}
    assert sorted(ranks.values()) == [0, 1, 2, 3]  # every replica reaches the same order from its own view


def test_shares_are_disjoint_and_cover_the_tie_when_it_has_a_worker_per_replica():
    for n, replicas in itertools.product(range(1, 12), range(2, 6)):
        tied = list(range(n))
        parts = [share(tied, ReplicaSlot(rank, replicas)) for rank in range(replicas)]
        if n >= replicas:
            assert sorted(x for part in parts for x in part) == tied  # disjoint, nothing left out
            assert max(map(len, parts)) - min(map(len, parts)) <= 1
        else:  # fewer workers than replicas: a replica with no share of its own draws from the whole tie
            assert all(part for part in parts)
            assert any(list(part) == tied for part in parts)
    assert share([1, 2, 3], None) == [1, 2, 3] and share([1, 2, 3], ReplicaSlot(0, 1)) == [1, 2, 3]
    assert [offset(4, ReplicaSlot(r, 4)) for r in range(4)] == [0, 1, 2, 3] and offset(4, None) == 0


def _picks(profile: ProfileSettings, slots: list[ReplicaSlot | None], seed: int, *, own_order: bool = True) -> list[str]:
    """Each replica's pick among four idle workers, each with its own RNG, and its candidates in an order of its own
    (``own_order``) or in discovery's."""
    workers = [w(x) for x in ("d1", "d2", "d3", "d4")]
    out = []
    for i, slot in enumerate(slots):
        accounting = Accounting()
        accounting.replica_slot = slot
        provider = LoadProvider(accounting)
        candidates = workers[i % 4:] + workers[:i % 4] if own_order else workers
        out.append(Pipeline(profile, rng=random.Random(seed * 10 + i)).select(provider.context(None, candidates), candidates))
    return [s.worker_id for s in out]


def test_four_replicas_at_one_moment_pick_four_different_idle_workers():
    slots = [ReplicaSlot(rank, 4) for rank in range(4)]
    for seed in range(30):
        assert len(set(_picks(KV_LIKE, slots, seed))) == 4
    # Without slots, independent draws pile up (this is what the slots remove).
    assert sum(len(set(_picks(KV_LIKE, [None] * 4, seed))) < 4 for seed in range(30)) > 15


def test_replicas_taking_turns_start_apart():
    profile = PICKER_PROFILES["least_inflight"]()
    slots = [ReplicaSlot(rank, 4) for rank in range(4)]
    assert len(set(_picks(profile, slots, 0))) == 4 and len(set(_picks(profile, slots, 0, own_order=False))) == 4
    assert len(set(_picks(profile, [None] * 4, 0, own_order=False))) == 1  # all four start at the first


def test_a_selection_says_when_a_tie_was_split():
    accounting = Accounting()
    accounting.replica_slot = ReplicaSlot(1, 2)
    ws = [w("a"), w("b"), w("c"), w("d")]
    selection = Pipeline(KV_LIKE).select(LoadProvider(accounting).context(None, ws), ws)
    assert selection.how == "tie_spread" and selection.worker_id in {"c", "d"}
    accounting.replica_slot = ReplicaSlot(0, 8)  # more replicas than tied workers: this one has no share of its own
    assert Pipeline(KV_LIKE).select(LoadProvider(accounting).context(None, ws), ws).how == "tie_random"
