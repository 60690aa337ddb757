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


async def test_stale_entries_are_ignored_until_heartbeat(tmp_path, caplog):
    reg = FileRegistry(tmp_path, ttl_s=0.3)
    await reg.publish(cfg())
    assert [c.worker_id for c in await reg.snapshot()] == ["prefill-a-8100"]
    await asyncio.sleep(0.5)
    assert await reg.snapshot() == []
    assert await reg.snapshot() == []
    left_out = [r.getMessage() for r in caplog.records if "TTL: left out" in r.getMessage()]
    assert len(left_out) == 1 and "prefill-a-8100" in left_out[0]  # said once per version of the entry, with its age
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


async def test_watch_sees_another_writers_change(tmp_path):
    reg = FileRegistry(tmp_path, poll_interval_s=0.1)
    seen: list[list[str]] = []

    async def consume():
        async for snap in reg.watch():
            seen.append([c.worker_id for c in snap])
            if len(seen) == 2:
                return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)
    await FileRegistry(tmp_path).publish(cfg())  # another process (writer) publishes
    await asyncio.wait_for(task, timeout=60)
    assert seen == [[], ["prefill-a-8100"]]  # another process's publish reaches the watch (no timing asserted)
    await reg.close()


def _entry(worker_id: str, heartbeat_at: object) -> str:
    return json.dumps({"heartbeat_at": heartbeat_at, "config": cfg(worker_id=worker_id).model_dump(mode="json")}).replace(
        '"heartbeat_at": "X"', '"heartbeat_at": X'
    )


async def test_hostile_entries_are_skipped_without_blocking(tmp_path, caplog):
    import os

    reg = FileRegistry(tmp_path)
    await reg.publish(cfg(worker_id="good-1"))
    target = tmp_path / "elsewhere.json"
    target.write_text(_entry("linked-1", time.time()))
    (tmp_path / "linked-1.worker.json").symlink_to(target)  # a symlink: never followed
    os.mkfifo(tmp_path / "fifo-1.worker.json")  # a FIFO: opening it for reading would block a naive reader
    (tmp_path / "huge-1.worker.json").write_text(_entry("huge-1", time.time()) + " " * 70_000)
    (tmp_path / "nan-1.worker.json").write_text(_entry("nan-1", "X").replace("X", "NaN"))
    (tmp_path / "inf-1.worker.json").write_text(_entry("inf-1", "X").replace("X", "1e400"))
    (tmp_path / "future-1.worker.json").write_text(_entry("future-1", time.time() + 3600))
    snapshot = await asyncio.wait_for(reg.snapshot(), timeout=30)
    assert [c.worker_id for c in snapshot] == ["good-1"]
    log = caplog.text
    for name, why in [("linked-1", "not a regular file"), ("fifo-1", "not a regular file"), ("huge-1", "bytes, more than"),
                      ("nan-1", "not finite"), ("inf-1", "not finite"), ("future-1", "in the future")]:
        assert f"{name}.worker.json: " in log and why in log.split(f"{name}.worker.json: ", 1)[1].split("\n", 1)[0]


async def test_a_directory_others_can_write_is_warned_about(tmp_path, caplog):
    (tmp_path / "reg").mkdir(mode=0o777)
    (tmp_path / "reg").chmod(0o777)
    await FileRegistry(tmp_path / "reg").snapshot()
    assert "writable by its group or by everyone" in caplog.text


async def test_thousands_of_entries_are_parsed_once_while_unchanged(tmp_path, monkeypatch):
    now = time.time()
    for i in range(3000):
        (tmp_path / f"w-{i}.worker.json").write_text(_entry(f"w-{i}", now))
    reg = FileRegistry(tmp_path, ttl_s=600)
    assert len(await reg.snapshot()) == 3000
    parses = []
    real = reg._parse
    monkeypatch.setattr(reg, "_parse", lambda path, info: parses.append(path.name) or real(path, info))
    assert len(await reg.snapshot()) == 3000 and parses == []  # unchanged: one stat each, no parse
    (tmp_path / "w-7.worker.json").write_text(_entry("w-7", now + 1))
    assert len(await reg.snapshot()) == 3000 and parses == ["w-7.worker.json"]
    (tmp_path / "w-8.worker.json").unlink()
    assert len(await reg.snapshot()) == 2999
