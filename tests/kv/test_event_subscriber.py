"""KVEventSubscriber against a real ZMQ PUB socket on 127.0.0.1, publishing vLLM's exact bytes."""

from __future__ import annotations

import random

import pytest
import zmq.asyncio

from litellm_disagg.engines.base import KVEventWire
from litellm_disagg.engines.vllm import VLLM
from litellm_disagg.routing.kv import native
from litellm_disagg.routing.kv.block_hash import chain_hashes
from litellm_disagg.routing.kv.event_applier import EventApplier
from litellm_disagg.routing.kv.event_subscriber import BadEndpoint, KVEventSubscriber, check_endpoint
from litellm_disagg.routing.kv.prefix_index import PrefixIndex
from tests.kv import vllm_wire as wire
from tests.kv.zmq_pub import FakeEnginePublisher, joined, until

BS = 16


def toks(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 30_000) for _ in range(n)]


def engine_hashes(tokens: list[int], salt: int) -> list[int]:
    out, h = [], salt
    for i in range(0, len(tokens) - BS + 1, BS):
        h = hash((h, "engine", tuple(tokens[i : i + BS]))) & (2**64 - 1)
        out.append(h)
    return out


@pytest.fixture
async def ctx():  # type: ignore[no-untyped-def]
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


def make(index: PrefixIndex, endpoint: str, ctx: zmq.asyncio.Context, **kw: object) -> KVEventSubscriber:
    index.add_worker("w", capacity_blocks=10_000)
    applier = EventApplier("w", index, block_size=BS, capacity_blocks=10_000)
    kw.setdefault("wire", VLLM.adapter.kv_event_wire)
    return KVEventSubscriber(
        endpoint, applier, decode=VLLM.adapter.decode_kv_events, context=ctx, reconnect_interval_s=0.02, reconnect_interval_max_s=0.1, **kw
    )  # type: ignore[arg-type]


@pytest.mark.parametrize("wire_format", [KVEventWire.VLLM, None])
async def test_events_from_a_publisher_reach_the_index(ctx: zmq.asyncio.Context, wire_format: KVEventWire | None) -> None:
    """Through the compiled path when it is built (every message here is one it reads), else the Python path."""
    pub = FakeEnginePublisher()
    index = PrefixIndex()
    sub = make(index, pub.endpoint, ctx, wire=wire_format)
    compiled = wire_format is not None and native.wire is not None
    assert (sub.fast_apply is not None) == compiled
    sub.start()
    try:
        await joined(pub, lambda: sub.messages)
        prompt = toks(16 * 10 + 3)
        eh = engine_hashes(prompt, 1)
        pub.send([wire.stored(eh[:4], None, prompt[: 4 * BS], BS)])
        pub.send([wire.stored(eh[4:], eh[3], prompt[4 * BS : 10 * BS], BS), wire.removed([eh[9]])])
        ours = chain_hashes(prompt, BS)
        await until(lambda: index.overlap(ours) == {"w": 9})
        assert sub.applier.stats.gaps == 0
        assert sub.fast_messages == (sub.messages if compiled else 0)
    finally:
        await sub.stop()
        pub.close()


async def test_reconnect_after_the_engine_restarts_on_the_same_port(ctx: zmq.asyncio.Context) -> None:
    pub = FakeEnginePublisher()
    index = PrefixIndex()
    sub = make(index, pub.endpoint, ctx)
    sub.start()
    try:
        await joined(pub, lambda: sub.messages)
        prompt = toks(64)
        pub.send([wire.stored(engine_hashes(prompt, 1), None, prompt, BS)])
        await until(lambda: index.blocks("w") == 4)
        port = pub.port
        pub.close()
        new = FakeEnginePublisher(port)  # a new engine process: sequence numbers start again at 0
        before = sub.messages
        await until(lambda: sub.messages > before, tick=lambda: new.send([], seq=0))
        assert sub.applier.stats.restarts == 1
        assert index.blocks("w") == 0  # the new engine's cache is empty
        other = toks(32, seed=4)
        new.send([wire.stored(engine_hashes(other, 2), None, other, BS)], seq=1)
        await until(lambda: index.overlap(chain_hashes(other, BS)) == {"w": 2})
        new.close()
    finally:
        await sub.stop()


async def test_gap_and_undecodable_message(ctx: zmq.asyncio.Context) -> None:
    pub = FakeEnginePublisher()
    index = PrefixIndex()
    sub = make(index, pub.endpoint, ctx)
    sub.start()
    try:
        await joined(pub, lambda: sub.messages)
        pub.send([], seq=pub.seq + 3)
        await until(lambda: sub.applier.stats.gaps == 1)
        pub.send_raw([b"kv", pub.seq.to_bytes(8, "big"), b"\xc1not msgpack"])
        await until(lambda: sub.applier.stats.malformed == 1)
        pub.send([], seq=pub.seq + 1)  # the undecodable batch's number was used: no further gap
        before = sub.messages
        await until(lambda: sub.messages > before)
        assert sub.applier.stats.gaps == 2  # the undecodable one counts as lost
    finally:
        await sub.stop()
        pub.close()


async def test_topic_filter(ctx: zmq.asyncio.Context) -> None:
    pub = FakeEnginePublisher(topic=b"other")
    index = PrefixIndex()
    sub = make(index, pub.endpoint, ctx, topic="kv")
    sub.start()
    try:
        for seq in range(20):
            pub.send([], seq=seq)
        import asyncio

        await asyncio.sleep(0.2)
        assert sub.messages == 0
    finally:
        await sub.stop()
        pub.close()


@pytest.mark.parametrize("endpoint", ["tcp://*:5557", "udp://1.2.3.4:5", "inproc://x"])
def test_endpoints_we_cannot_connect_to(endpoint: str) -> None:
    with pytest.raises(BadEndpoint):
        check_endpoint(endpoint)
    assert check_endpoint("tcp://10.0.0.5:5557") == "tcp://10.0.0.5:5557"
