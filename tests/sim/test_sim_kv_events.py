"""KV events over ZMQ, read the way a subscriber written for real vLLM reads them: a SUB socket and msgpack."""

from __future__ import annotations

import os
import time

import msgpack
import pytest
import zmq
import zmq.asyncio

from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim import SimWorker
from litellm_disagg.sim.hashing import block_hashes
from litellm_disagg.sim.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch, encode_batch

from .conftest import fast_settings


class Subscriber:
    def __init__(self, endpoint: str, topic: bytes = b"kv"):
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(endpoint)
        self.frames: list[list[bytes]] = []

    async def recv(self, timeout: float = 2.0) -> list[bytes] | None:
        if await self.sock.poll(int(timeout * 1000)):
            frames = await self.sock.recv_multipart()
            self.frames.append(frames)
            return frames
        return None

    def events(self) -> list[dict]:
        return [e for f in self.frames for e in msgpack.unpackb(f[2])[1]]

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


async def completion(client, worker: SimWorker, prompt: str, max_tokens: int = 1) -> dict:
    r = await client.post(f"{worker.base_url}/completions", json={"prompt": prompt, "max_tokens": max_tokens})
    assert r.status_code == 200, r.text
    return r.json()


async def tokens(client, worker: SimWorker, prompt: str) -> list[int]:
    return (await client.post(f"{worker.server_url}/tokenize", json={"prompt": prompt})).json()["tokens"]


async def subscribed(client, worker: SimWorker) -> Subscriber:
    """A subscriber that has seen one batch (ZMQ drops what a PUB sends before the SUB is connected)."""
    assert worker.kv_events_endpoint is not None and worker.kv_events_endpoint.startswith("tcp://127.0.0.1:")
    sub = Subscriber(worker.kv_events_endpoint)
    deadline = time.monotonic() + 10
    i = 0
    while time.monotonic() < deadline:
        await completion(client, worker, f"warm up {i} " + "x " * 20)  # 20+ tokens: at least one full block
        if await sub.recv(timeout=0.2) is not None:
            while await sub.recv(timeout=0.05) is not None:
                pass
            sub.frames.clear()
            return sub
        i += 1
    raise AssertionError("no KV event arrived")


async def drain(sub: Subscriber, timeout: float = 0.3) -> None:
    while await sub.recv(timeout=timeout) is not None:
        pass


@pytest.fixture
async def worker():
    w = SimWorker(
        "sim-events-0",
        WorkerRole.BOTH,
        fast_settings(num_gpu_blocks=24, block_size=4, max_model_len=64, kv_events=True),
    )
    await w.start()
    yield w
    await w.stop()


async def test_block_stored_carries_the_prompt_tokens(worker, client):
    sub = await subscribed(client, worker)
    try:
        prompt = "the quick brown fox jumps over the lazy dog and runs"
        ids = await tokens(client, worker, prompt)
        assert len(ids) == 11
        await completion(client, worker, prompt)
        await drain(sub)
        topic, seq, payload = sub.frames[0]
        assert topic == b"kv" and len(seq) == 8
        seqs = [int.from_bytes(f[1], "big") for f in sub.frames]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        ts, events, rank = msgpack.unpackb(payload)
        assert isinstance(ts, float) and abs(ts - time.time()) < 30 and rank == 0
        [stored] = [e for e in sub.events() if e["type"] == "BlockStored"]
        assert list(stored) == [
            "type",
            "block_hashes",
            "parent_block_hash",
            "token_ids",
            "block_size",
            "lora_id",
            "medium",
            "lora_name",
            "extra_keys",
            "group_idx",
        ]
        assert stored["token_ids"] == ids[:8]  # two full blocks of 4; the partial third is not cached
        assert stored["block_hashes"] == block_hashes(ids, 4)
        assert stored["parent_block_hash"] is None and stored["block_size"] == 4 and stored["medium"] == "GPU"
        assert stored["lora_id"] is None and stored["extra_keys"] == [None, None] and stored["group_idx"] == 0

        # The same prefix again: cached, no new BlockStored for those blocks; a longer one chains onto them.
        await completion(client, worker, prompt + " away from here")
        await drain(sub)
        [again] = [e for e in sub.events() if e["type"] == "BlockStored"][1:]
        assert again["parent_block_hash"] == stored["block_hashes"][-1]
        assert again["token_ids"] == (await tokens(client, worker, prompt + " away from here"))[8:12]
    finally:
        sub.close()


async def test_reset_sends_all_cleared_and_eviction_sends_block_removed(worker, client):
    sub = await subscribed(client, worker)
    try:
        assert (await client.post(f"{worker.server_url}/reset_prefix_cache")).status_code == 200
        await drain(sub)
        assert sub.events()[-1] == {"type": "AllBlocksCleared"}
        sub.frames.clear()
        for i in range(12):  # 12 prompts x 4 full blocks each in a 24-block cache
            await completion(client, worker, f"prompt number {i} " + "word " * 14)
        await drain(sub)
        events = sub.events()
        stored = {h for e in events if e["type"] == "BlockStored" for h in e["block_hashes"]}
        removed = [h for e in events if e["type"] == "BlockRemoved" for h in e["block_hashes"]]
        assert removed and set(removed) <= stored  # only cached blocks are evicted, each once
        assert len(removed) == len(set(removed))
        assert all(e["medium"] == "GPU" and e["group_idx"] == 0 for e in events if e["type"] == "BlockRemoved")
    finally:
        sub.close()


# vLLM 0.32's own encoder (msgspec) on the batch built by ``_reference_events`` at ts=1234.5, data_parallel_rank=0:
# ``msgspec.msgpack.Encoder().encode(KVEventBatch(...)).hex()``. Recorded once so the fast test needs no vLLM import
# (about 10 s); ``test_encoding_matches_installed_vllm`` recomputes it with the installed vLLM on request.
VLLM_0_32_GOLDEN = bytes.fromhex(
    "93cb40934a0000000000948aa474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739201cfffffffffffffffffb17061"
    "72656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739405060708aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d6564"
    "69756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f696478008aa474797065ab426c6f636b53"
    "746f726564ac626c6f636b5f6861736865739109b1706172656e745f626c6f636b5f68617368cfffffffffffffffffa9746f6b656e5f6964"
    "739401020304aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f"
    "6b65797391c0a967726f75705f6964780084a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739103a66d656469"
    "756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400"
)


def _reference_events():
    return [
        BlockStored((1, 2**64 - 1), None, (5, 6, 7, 8), 4),
        BlockStored((9,), 2**64 - 1, (1, 2, 3, 4), 4),
        BlockRemoved((3,)),
        AllBlocksCleared(),
    ]


def test_encoding_is_byte_identical_to_vllms():
    assert encode_batch(1234.5, _reference_events()) == VLLM_0_32_GOLDEN
    ts, events, rank = decode_batch(VLLM_0_32_GOLDEN)
    assert (ts, rank) == (1234.5, 0) and events == _reference_events()


@pytest.mark.skipif(
    os.environ.get("LITELLM_DISAGG_SIM_VLLM_CHECK") != "1",
    reason="imports vLLM (about 10 s): set LITELLM_DISAGG_SIM_VLLM_CHECK=1",
)
def test_encoding_matches_installed_vllm():
    kv_events = pytest.importorskip("vllm.distributed.kv_events")
    import msgspec

    theirs = kv_events.KVEventBatch(
        ts=1234.5,
        events=[
            kv_events.BlockStored(
                block_hashes=[1, 2**64 - 1],
                parent_block_hash=None,
                token_ids=[5, 6, 7, 8],
                block_size=4,
                lora_id=None,
                medium="GPU",
                lora_name=None,
                extra_keys=[None, None],
                group_idx=0,
            ),
            kv_events.BlockStored(
                block_hashes=[9],
                parent_block_hash=2**64 - 1,
                token_ids=[1, 2, 3, 4],
                block_size=4,
                lora_id=None,
                medium="GPU",
                lora_name=None,
                extra_keys=[None],
                group_idx=0,
            ),
            kv_events.BlockRemoved(block_hashes=[3], medium="GPU", group_idx=0),
            kv_events.AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )
    assert encode_batch(1234.5, _reference_events()) == msgspec.msgpack.Encoder().encode(theirs)
    decoded = msgspec.msgpack.Decoder(kv_events.KVEventBatch).decode(encode_batch(1.0, _reference_events()))
    assert isinstance(decoded.events[0], kv_events.BlockStored) and decoded.events[0].token_ids == [5, 6, 7, 8]
