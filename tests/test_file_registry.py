"""File-registry specifics (the contract shared with other backends lives in test_registry_contract.py)."""

import asyncio
import json
import time

import pytest

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.runtime_config import RuntimeConfig

from .test_runtime_config import VALID


def cfg(**change):
    return RuntimeConfig.model_validate(VALID | change)


async def test_writes_are_atomic_json_and_leave_no_temp_files(tmp_path):
    reg = FileRegistry(tmp_path)
    await reg.publish(cfg())
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["prefill-a-8100.worker.json"]
    record = json.loads((tmp_path / files[0]).read_text())
    assert record["config"]["worker_id"] == "prefill-a-8100"
    assert abs(record["heartbeat_at"] - time.time()) < 5


async def test_stale_entries_are_ignored_until_heartbeat(tmp_path):
    reg = FileRegistry(tmp_path, ttl_s=0.3)
    await reg.publish(cfg())
    assert [c.worker_id for c in await reg.snapshot()] == ["prefill-a-8100"]
    await asyncio.sleep(0.5)
    assert await reg.snapshot() == []
    await reg.heartbeat("prefill-a-8100")
    assert len(await reg.snapshot()) == 1


async def test_broken_entries_are_skipped_and_logged_once(tmp_path, caplog):
    reg = FileRegistry(tmp_path)
    await reg.publish(cfg())
    (tmp_path / "garbage.worker.json").write_text("{not json")
    (tmp_path / "badrole.worker.json").write_text(json.dumps({"heartbeat_at": time.time(), "config": VALID | {"worker_id": "badrole", "role": "x"}}))
    (tmp_path / "mismatch.worker.json").write_text(json.dumps({"heartbeat_at": time.time(), "config": VALID}))
    (tmp_path / "noheartbeat.worker.json").write_text(json.dumps({"config": VALID | {"worker_id": "noheartbeat"}}))
    for _ in range(3):
        assert [c.worker_id for c in await reg.snapshot()] == ["prefill-a-8100"]
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 4, [r.getMessage() for r in warnings]


async def test_unwritable_directory_raises_registry_error(tmp_path):
    from litellm_disagg.discovery.registry import RegistryError

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RegistryError):
        await FileRegistry(blocker / "sub").publish(cfg())


async def test_watch_sees_a_change_within_a_second(tmp_path):
    reg = FileRegistry(tmp_path, poll_interval_s=0.1)
    seen: list[list[str]] = []

    async def consume():
        async for snap in reg.watch():
            seen.append([c.worker_id for c in snap])
            if len(seen) == 2:
                return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)
    start = time.monotonic()
    await FileRegistry(tmp_path).publish(cfg())  # another process (writer) publishes
    await asyncio.wait_for(task, timeout=2)
    assert seen == [[], ["prefill-a-8100"]]
    assert time.monotonic() - start < 1.0
    await reg.close()
