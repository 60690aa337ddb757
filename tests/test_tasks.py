"""``litellm_disagg.tasks.cancel``: every background loop is stopped through it, so it must end a task even when the
task lost its cancellation (Python 3.11's ``asyncio.wait_for`` drops one that meets its inner call's result; a CI run
hung on a Redis exchange loop that had)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from litellm_disagg.tasks import cancel


async def test_a_task_that_lost_its_cancellation_is_cancelled_again_until_it_ends(caplog):
    lost = []

    async def loop_that_loses_one() -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost.append(True)  # what a wait_for racing its reply does on 3.11: the loop runs on

    task = asyncio.create_task(loop_that_loses_one(), name="loses-one")
    await asyncio.sleep(0.02)
    with caplog.at_level(logging.WARNING, logger="litellm_disagg.tasks"):
        async with asyncio.timeout(60):  # a hang guard: without the second cancellation this never ends
            await cancel([task], recancel_s=0.05)
    assert task.cancelled() and lost == [True]
    assert "loses-one" in caplog.text


async def test_a_task_that_ends_with_an_error_raises_it_and_none_is_skipped():
    async def fails_on_cancel() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise RuntimeError("clean-up failed") from None

    async def sleeps() -> None:
        await asyncio.sleep(60)

    first, second = asyncio.create_task(fails_on_cancel()), asyncio.create_task(sleeps())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="clean-up failed"):
        await cancel([None, first, second])
    assert second.cancelled()
