"""Waiting on a condition inside a test's event loop: polls it, never a fixed sleep."""
import asyncio


async def until(cond, what: str) -> None:
    for _ in range(20000):  # polls the condition; the bound only turns a hang into a failure
        if cond():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"timed out waiting for {what}")
