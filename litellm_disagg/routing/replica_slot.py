"""A proxy replica's slot among the live replicas: where its ties go, so that replicas deciding at once part ways.

Several replicas behind one address see the same idle workers until the in-flight exchange
(``shared_inflight.py``) carries each one's latest choice to the others: a round trip and a wake-up at best. Two cold
prompts placed through two replicas within that window tie on every idle worker, and a tie broken at random sends
both to the same worker one time in the number of tied workers (on the simulator's 4P+4D through four replicas, the
prompts left queueing behind another cold prompt were 2.6-6.2 ms apart). Nothing on the request's path can close
that window without a round trip to Redis per decision.

So a tie is split by slot instead: the replicas alive in the last exchange, ordered by their ids, give each replica
a rank, and the picker (``pipeline/picker.py``) draws a tie only from its rank's share of the tied workers in
worker-id order (``share``). Replicas that see the same tie draw from disjoint shares, so simultaneous cold prompts
land on different workers whenever there are at least as many tied workers as replicas; a replica alone (no Redis,
or no peer heard from) keeps the whole tie. Nothing here is trusted beyond ordering: a peer's id only moves ranks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple, TypeVar

T = TypeVar("T")


class ReplicaSlot(NamedTuple):
    rank: int
    """This replica's position among the live replicas' ids, sorted (0-based)."""
    replicas: int
    """How many replicas were alive in the last exchange, this one included."""


def slot_of(me: str, others: Iterable[str]) -> ReplicaSlot | None:
    """This replica's slot among ``others`` (the other live replicas' ids); None when it is alone."""
    ids = sorted({*others, me})
    if len(ids) < 2:
        return None
    return ReplicaSlot(ids.index(me), len(ids))


def share(tied: Sequence[T], slot: ReplicaSlot | None) -> Sequence[T]:
    """The part of ``tied`` (in an order every replica shares) that ``slot`` draws from: the ``rank``-th of
    ``replicas`` contiguous, near-equal parts; all of ``tied`` when the part would be empty (fewer tied workers than
    replicas: some replicas must share one then) or there is no slot."""
    if slot is None or slot.replicas < 2:
        return tied
    n = len(tied)
    lo = slot.rank * n // slot.replicas
    hi = (slot.rank + 1) * n // slot.replicas
    return tied[lo:hi] or tied


def offset(n: int, slot: ReplicaSlot | None) -> int:
    """Where ``slot``'s rotation over ``n`` tied workers starts: replicas taking turns start apart."""
    if slot is None or slot.replicas < 2 or n <= 0:
        return 0
    return slot.rank * n // slot.replicas
