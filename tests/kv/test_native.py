"""The compiled KV routing core (``routing/kv/_kvcore.pyx``) against its pure-Python twins, on the same inputs.

``scripts/setup.sh`` builds it (``scripts/build_native.sh``); these tests fail when it is not built, unless
``LITELLM_DISAGG_PURE_PYTHON`` is set (a deliberately pure-Python run). Without it the package still imports and
routes (checked in a subprocess that cannot import the extension).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Callable

import pytest

from litellm_disagg.routing.kv import block_hash, native, prefix_index
from litellm_disagg.routing.kv.block_hash import ROOT, chain_hashes, chain_hashes_py, root_hash
from litellm_disagg.routing.kv.prefix_index import PrefixIndex

pytestmark = pytest.mark.skipif(
    os.environ.get(native.DISABLE_ENV, "") not in ("", "0"), reason="pure-Python run requested"
)


def test_the_compiled_core_is_built_and_in_use() -> None:
    assert native.NATIVE, f"compiled KV routing core not in use: {native.WHY} (run scripts/build_native.sh)"


@pytest.mark.parametrize("block_size", [1, 2, 3, 16, 64])
def test_block_hashes_equal_the_python_definition(block_size: int) -> None:
    rng = random.Random(block_size)
    parents = [ROOT, root_hash("lora-a"), 0, -1, -2, 2**61 - 2, 2**61 - 1, 2**61, -(2**61) + 1, -(2**63), 2**63 - 1]
    for n in (0, 1, block_size - 1, block_size, block_size + 1, 8192 + 7, 1000):
        tokens = [rng.randrange(-(2**63), 2**63) if rng.random() < 0.05 else rng.randrange(200_000) for _ in range(n)]
        for parent in parents + [rng.getrandbits(64) - 2**63 for _ in range(4)]:
            expected = chain_hashes_py(tokens, block_size, parent)
            assert chain_hashes(tokens, block_size, parent) == expected
            assert chain_hashes(tuple(tokens), block_size, parent) == expected
            assert chain_hashes(iter(tokens), block_size, parent) == expected  # type: ignore[arg-type]
    # Ids that are Python ints of any size, and parents outside the compiled range (the Python path serves those).
    odd = [0, 2**64, -(2**70), 2**61 - 1, -1, True, 7] * 5
    assert chain_hashes(odd, 5) == chain_hashes_py(odd, 5)
    assert chain_hashes(odd, 5, parent=2**70) == chain_hashes_py(odd, 5, 2**70)


def _random_ops(seed: int, n_workers: int) -> list[tuple[str, str, list[int]]]:
    """Stores (chained prefixes, shared and private), removals, routed predictions and clears over ``n_workers``."""
    rng = random.Random(seed)
    docs = [chain_hashes_py([rng.randrange(1000) for _ in range(16 * 40)], 16) for _ in range(6)]
    return _ops(rng, docs, n_workers, 600, [40, 25, 15, 2, 18], lambda: rng.getrandbits(63), 30, 12)


def _ops(
    rng: random.Random,
    docs: list[list[int]],
    n_workers: int,
    n: int,
    weights: list[int],
    private_hash: Callable[[], int],
    private_max: int,
    removed_max: int,
) -> list[tuple[str, str, list[int]]]:
    """``n`` random operations over ``docs`` (weights of stored, removed, routed, cleared, private stores)."""
    ops: list[tuple[str, str, list[int]]] = []
    for _ in range(n):
        wid = f"w{rng.randrange(n_workers)}"
        doc = rng.choice(docs)
        kind = rng.choices(["stored", "removed", "routed", "cleared", "private"], weights)[0]
        if kind == "stored":
            ops.append(("stored", wid, doc[: rng.randrange(1, len(doc))]))
        elif kind == "private":
            ops.append(("stored", wid, [private_hash() for _ in range(rng.randrange(1, private_max))]))
        elif kind == "removed":
            start = rng.randrange(len(doc))
            ops.append(("removed", wid, doc[start : start + rng.randrange(1, removed_max)]))
        elif kind == "routed":
            ops.append(("routed", wid, doc[: rng.randrange(1, len(doc))]))
        else:
            ops.append(("cleared", wid, []))
    return ops


def _run(
    ops: list[tuple[str, str, list[int]]], n_workers: int, queries: list[list[int]], *, sinks: bool = False
) -> object:
    """Apply ``ops``; ``sinks``: stores and removals through each worker's ``PrefixIndex.precise_sink`` as the
    compiled KV-event path makes them (kept until stale; the index's method when the sink does not apply)."""
    clock = iter(range(10**9))
    index = PrefixIndex(clock=lambda: float(next(clock)))
    for i in range(n_workers):
        # Some approximate workers (their stores take the Python path in both runs), most precise.
        index.add_worker(f"w{i}", capacity_blocks=150, ttl_s=1e6 if i % 5 == 4 else None)
    held_sinks: dict[str, object] = {}

    def sink(wid: str) -> object:
        current = held_sinks.get(wid)
        if current is None or not current.valid:  # type: ignore[attr-defined]
            current = held_sinks[wid] = index.precise_sink(wid)
        return current

    overlaps = []
    for step, (kind, wid, hashes) in enumerate(ops):
        if kind == "stored":
            if not (sinks and sink(wid).stored(hashes)):  # type: ignore[attr-defined]
                index.stored(wid, hashes)
        elif kind == "removed":
            hs = iter(hashes) if step % 2 else hashes
            if not (sinks and sink(wid).removed(hs)):  # type: ignore[attr-defined]
                index.removed(wid, hs)
        elif kind == "routed":
            index.record_routed(wid, hashes)
        elif kind == "resize":  # capacity and mode of a known worker (the trim runs at once when it shrinks)
            index.add_worker(wid, capacity_blocks=hashes[0], ttl_s=1e6 if hashes[1] else None)
        elif kind == "leave":
            index.remove_worker(wid)
        elif kind == "join":
            index.add_worker(wid, capacity_blocks=hashes[0], ttl_s=None)
        else:
            index.cleared(wid)
        if step % 7 == 0:
            overlaps.append([index.overlap(q) for q in queries])
        if step % 50 == 0:
            index.maintain(max_items=40)
    slots = [
        None if s is None else (s.worker_id, list(s.held.items()), list(s.predicted.items())) for s in index._slots
    ]
    held = dict(index._held.items())
    assert len(index._held) == len(held) and all(index._held.get(h) == m and h in index._held for h, m in held.items())
    return overlaps, held, dict(index._predicted), slots, index.stats()


@pytest.mark.parametrize(("seed", "n_workers"), [(1, 4), (2, 40), (3, 70)])
def test_prefix_index_is_the_same_compiled_or_not(seed: int, n_workers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same operations and queries, with and without the compiled loops: equal answers, equal state (LRU order
    included). 70 workers: past 64 slots the index takes the Python path itself."""
    assert native.NATIVE, native.WHY
    ops = _random_ops(seed, n_workers)
    rng = random.Random(seed)
    queries = [op[2] for op in rng.sample(ops, 20) if op[2]] + [[rng.getrandbits(63)], []]
    compiled = _run(ops, n_workers, queries)
    probe = PrefixIndex()
    for i in range(n_workers):
        probe.add_worker(f"w{i}", capacity_blocks=1)
    # The compiled run used the C table up to 64 slots, a dict past them.
    assert isinstance(probe._held, native.core.MaskTable if n_workers <= 64 else dict)
    with monkeypatch.context() as m:
        m.setattr(prefix_index, "_native", None)
        m.setattr(block_hash, "_native", None)
        pure = _run(ops, n_workers, queries)
    assert compiled == pure
    assert any(any(o) for o in compiled[0])  # the queries found something



def _routed_state(core: object) -> object:
    """Two precise workers holding parts of a prompt; the prompt routed to each (held blocks move to the end of the
    worker's LRU, the rest become predictions): every slot's LRU in order, and the predictions."""
    clock = iter(range(10**9))
    index = PrefixIndex(clock=lambda: float(next(clock)))
    index._core = core  # type: ignore[assignment]
    for wid in ("a", "b"):
        index.add_worker(wid, capacity_blocks=100)
    rng = random.Random(5)
    prompt = [rng.getrandbits(63) for _ in range(40)]
    index.stored("a", prompt[:10] + prompt[20:25] + [7, 8, 9])
    index.stored("b", prompt[30:])
    index.record_routed("a", prompt)
    index.record_routed("b", tuple(prompt[:35]))
    index.record_routed("a", prompt[5:12])
    slots = [(s.worker_id, list(s.held.items()), list(s.predicted.items())) for s in index._slots if s is not None]
    return slots, dict(index._predicted), [q[2:] for q in index._prediction_queue]


def test_record_routed_is_the_same_compiled_or_not() -> None:
    """``PrefixIndex.record_routed``'s LRU pass (``_kvcore.touch_routed``) against the Python loop, LRU order
    included; a compiled core built before the kernel existed takes the Python loop."""
    assert native.NATIVE, native.WHY
    assert hasattr(native.core, "touch_routed")

    class OlderBuild:
        def __getattr__(self, name: str) -> object:
            if name == "touch_routed":
                raise AttributeError(name)
            return getattr(native.core, name)

    compiled = _routed_state(native.core)
    assert compiled == _routed_state(OlderBuild())
    (_, a_lru, a_predicted), (_, _, b_predicted) = compiled[0]
    assert len(a_lru) == 18 and len(a_predicted) == 25 and len(b_predicted) == 30
    assert [h for h, _ in a_lru][:2] == [7, 8]  # a's routed blocks moved to the end of its LRU, behind the others


def test_touch_routed_moves_held_hashes_and_returns_the_others() -> None:
    assert native.core is not None, native.WHY
    held = native.core.MaskTable()
    lru = {1: "x", 2: "y", 3: "z"}
    for h in lru:
        held[h] = 0b10
    held[4] = 0b01  # held by another slot only
    assert native.core.touch_routed(held, lru, [2, 4, 1, 5], 0b10) == [4, 5]
    assert list(lru.items()) == [(3, "z"), (2, "y"), (1, "x")]
    with pytest.raises(KeyError):  # an LRU out of step with the table, as the Python loop's ``lru.pop``
        native.core.touch_routed(held, {}, [3], 0b10)


def _table_keys(rng: random.Random) -> list[int]:
    """Keys that collide and cluster (small ints), random 64-bit hashes, the int64 edges, and ints outside int64
    (kept by the table's dict)."""
    small = list(range(-40, 300))
    edges = [0, -1, -2, 2**63 - 1, -(2**63), 2**61 - 1, -(2**61)]
    outside = [2**63, 2**64, -(2**63) - 1, 2**70, -(2**90)]
    return small + edges + outside + [rng.getrandbits(64) - 2**63 for _ in range(400)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mask_table_answers_as_a_dict(seed: int) -> None:
    """``MaskTable`` against a dict on random sets, reads, pops and deletions: growth past many resizes, shrinking
    back when emptied (memory follows the entries), deletions inside probe clusters (its backward shift)."""
    rng = random.Random(seed)
    keys = _table_keys(rng)
    table = native.core.MaskTable()
    ref: dict[int, int] = {}
    for step in range(30_000):
        h = rng.choice(keys)
        op = rng.random()
        if step > 20_000 and op < 0.6:  # the last third mostly empties the table
            op = 0.8
        if op < 0.45:
            m = rng.choice([1, 2**63, 2**64 - 1, rng.getrandbits(64) or 1])
            table[h] = m
            ref[h] = m
        elif op < 0.6:
            assert table.get(h, 0) == ref.get(h, 0) and table.get(h) == ref.get(h) and (h in table) == (h in ref)
        elif op < 0.8:
            assert table.pop(h, None) == ref.pop(h, None)
        elif h in ref:
            del table[h]
            del ref[h]
        else:
            with pytest.raises(KeyError):
                del table[h]
        if step % 997 == 0:
            assert len(table) == len(ref) and dict(table.items()) == ref and sorted(table) == sorted(ref)
            assert all(table[k] == v for k, v in ref.items())
    assert dict(table.items()) == ref
    grown = native.core.MaskTable()
    for i in range(100_000):
        grown[i * 7919] = 1
    big = grown.cells()
    assert big >= 200_000 and len(grown) == 100_000
    for i in range(100_000):
        assert grown.pop(i * 7919) == 1
    assert len(grown) == 0 and grown.cells() <= 128 and big > 1000 * grown.cells()
    for bad in (0, -1, 2**64):
        with pytest.raises((ValueError, OverflowError)):
            grown[5] = bad
    assert 5 not in grown


def test_prefix_index_is_the_same_compiled_or_not_at_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    """Longer random streams over 60 workers with evictions past capacity (the trim), removals and clears: the C
    table grows and shrinks many times; the compiled index keeps answering as the dict one."""
    rng = random.Random(11)
    docs = [chain_hashes_py([rng.randrange(1000) for _ in range(16 * 200)], 16) for _ in range(30)]
    ops = _ops(rng, docs, 60, 3000, [45, 30, 10, 1, 14], lambda: rng.getrandbits(64) - 2**63, 100, 150)
    queries = [doc[: rng.randrange(1, len(doc))] for doc in docs] + [[rng.getrandbits(63)]]
    compiled = _run(ops, 60, queries)
    with monkeypatch.context() as m:
        m.setattr(prefix_index, "_native", None)
        m.setattr(block_hash, "_native", None)
        pure = _run(ops, 60, queries)
    assert compiled == pure
    assert any(any(o) for o in compiled[0])


def _worker_churn(rng: random.Random, ops: list[tuple[str, str, list[int]]], n_workers: int) -> None:
    """Insert worker changes into ``ops``: capacity and mode changes, departures, returns and new workers (enough of
    them that the index passes 64 slots half-way and leaves the compiled core)."""
    joined = n_workers
    for position in sorted(rng.sample(range(len(ops)), len(ops) // 20), reverse=True):
        roll = rng.random()
        wid = f"w{rng.randrange(joined)}"
        if roll < 0.35:
            ops.insert(position, ("resize", wid, [rng.randrange(20, 200), int(rng.random() < 0.2)]))
        elif roll < 0.6:
            ops.insert(position, ("leave", wid, []))
        elif roll < 0.8:
            ops.insert(position, ("join", wid, [rng.randrange(20, 200)]))  # back (or a capacity change)
        else:
            ops.insert(position, ("join", f"w{joined}", [150]))
            joined += 1


@pytest.mark.parametrize(("seed", "n_workers"), [(21, 6), (22, 40), (23, 60)])
def test_precise_sinks_apply_as_the_index_methods(seed: int, n_workers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stores and removals through ``PrefixIndex.precise_sink`` (as ``_kvwire`` applies them) against the index's own
    methods and the pure-Python index: equal state after random streams with predictions to confirm, trims, clears
    and worker churn (each change makes the sinks handed out stale; past 64 slots they stop applying anything)."""
    assert native.NATIVE, native.WHY
    rng = random.Random(seed)
    docs = [chain_hashes_py([rng.randrange(1000) for _ in range(16 * 60)], 16) for _ in range(10)]
    ops = _ops(rng, docs, n_workers, 2500, [45, 25, 20, 2, 12], lambda: rng.getrandbits(63), 40, 30)
    _worker_churn(rng, ops, n_workers)
    queries = [doc[: rng.randrange(1, len(doc))] for doc in docs] + [[rng.getrandbits(63)]]
    through_sinks = _run(ops, n_workers, queries, sinks=True)
    assert through_sinks == _run(ops, n_workers, queries)
    with monkeypatch.context() as m:
        m.setattr(prefix_index, "_native", None)
        m.setattr(block_hash, "_native", None)
        assert through_sinks == _run(ops, n_workers, queries, sinks=False)
    assert any(any(o) for o in through_sinks[0])  # type: ignore[index]


def test_a_precise_sink_applies_only_what_it_should() -> None:
    """A precise worker's sink applies stores (confirming predictions) and removals; one for an approximate or unknown
    worker applies nothing; every change to the index's slots makes the sinks handed out stale."""
    assert native.NATIVE, native.WHY
    index = PrefixIndex()
    index.add_worker("p", capacity_blocks=32)
    index.add_worker("a", capacity_blocks=32, ttl_s=60.0)
    precise, approximate, unknown = index.precise_sink("p"), index.precise_sink("a"), index.precise_sink("x")
    assert precise.fast and not approximate.fast and not unknown.fast
    assert not approximate.stored([1, 2]) and not approximate.removed([1]) and not unknown.stored([1])
    assert index.blocks("a") == 0
    index.record_routed("p", [1, 2, 3])
    assert index.has_predictions
    assert precise.stored([1, 2, 3, 4])
    assert index.overlap([1, 2, 3, 4], predicted=False) == {"p": 4} and not index.has_predictions
    assert precise.removed([2, 9])
    assert [index.holds("p", h) for h in (1, 2, 3, 4, 9)] == [True, False, True, True, False]
    assert precise.stored(list(range(100, 140)))  # past capacity 32: trimmed to 30, the oldest first
    assert index.blocks("p") == 30 and index.holds("p", 139) and not index.holds("p", 1)
    for change in (
        lambda: index.add_worker("p", capacity_blocks=64),
        lambda: index.add_worker("new", capacity_blocks=8),
        lambda: index.cleared("p"),
        lambda: index.remove_worker("a"),
    ):
        sink = index.precise_sink("p")
        assert sink.valid and sink.fast
        change()
        assert not sink.valid and not sink.stored([5]) and not sink.removed([139])
    assert not index.holds("p", 5)


def test_the_package_routes_without_the_extension() -> None:
    """A process that cannot import ``_kvcore`` (as on a machine where it was never built) falls back to Python."""
    code = (
        "import sys; sys.modules['litellm_disagg.routing.kv._kvcore'] = None\n"
        "from litellm_disagg.routing.kv import native\n"
        "from litellm_disagg.routing.kv.block_hash import PromptBlocks, chain_hashes_py\n"
        "from litellm_disagg.routing.kv.prefix_index import PrefixIndex\n"
        "assert not native.NATIVE and 'not built' in native.WHY, native.WHY\n"
        "p = PromptBlocks(list(range(64)))\n"
        "i = PrefixIndex(); i.add_worker('w', capacity_blocks=10); i.stored('w', p.hashes(16))\n"
        "assert p.hashes(16) == chain_hashes_py(list(range(64)), 16) and i.overlap(p.hashes(16)) == {'w': 4}\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_environment_switch_disables_it() -> None:
    code = "from litellm_disagg.routing.kv import native; print(native.NATIVE, native.WHY)"
    env = {**os.environ, native.DISABLE_ENV: "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert done.stdout.startswith("False disabled"), done.stderr


def test_kv_cost_scorer_equals_the_per_worker_definition() -> None:
    """``KVCostScorer.costs`` (written out for speed) against ``kv_cost`` per worker, on random loads and caches."""
    from litellm_disagg.routing.kv.load_scraper import ScrapedLoad
    from litellm_disagg.routing.pipeline.context import ScoringContext, WorkerLoad
    from litellm_disagg.routing.pipeline.profile import CostWeights
    from litellm_disagg.routing.pipeline.scorers.kv_cost import KVCostScorer, kv_cost
    from litellm_disagg.runtime_config import RuntimeConfig, VllmNixlTransfer, WorkerRole

    rng = random.Random(7)
    workers = [
        RuntimeConfig(
            worker_id=f"w{i}",
            model="m",
            role=WorkerRole.BOTH,
            base_url=f"http://127.0.0.1:{9000 + i}/v1",
            transfer=VllmNixlTransfer(host="127.0.0.1", port=5600),
            kv_capacity_blocks=rng.choice([0, 100, 4096]),
            block_size=rng.choice([1, 16, 32]),
        )
        for i in range(40)
    ]
    for _ in range(30):
        prompt = rng.choice([0, 1, 17, 8192])
        loads = {
            w.worker_id: WorkerLoad(
                w.worker_id,
                w.kv_capacity_blocks,
                rng.randrange(5),
                rng.randrange(3000),
                rng.randrange(200),
                ScrapedLoad(
                    running=rng.randrange(4), waiting=rng.randrange(4), kv_usage=rng.random(), stale=rng.random() < 0.3
                ),
            )
            for w in workers
            if rng.random() < 0.8  # some without a snapshot
        }
        ctx = ScoringContext(
            prompt, {w.worker_id: rng.randrange(prompt + 40) for w in workers if rng.random() < 0.5}, loads
        )
        weights = CostWeights(prefill=rng.random() * 2, decode=rng.choice([0.0, 1.0]), active=rng.random())
        assert KVCostScorer(weights).costs(ctx, workers) == {w.worker_id: kv_cost(ctx, w, weights) for w in workers}
