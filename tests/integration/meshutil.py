"""Helpers for integration tests: start a real mesh, watch its announcements, call its API."""
from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from contextlib import contextmanager

import httpx
import msgspec
import nats

from dualpath.mesh import Mesh, MeshSpec
from shared.messages.endpoints import EP
from shared.messages.registry import Announce, EngineAnnounce


def tiny_mesh(tmp_path, **kw) -> Mesh:
    spec = MeshSpec(model=kw.pop("model", "tiny"), port=0, kv_blocks=kw.pop("kv_blocks", 64),
                    buffer_mb=kw.pop("buffer_mb", 16), log_dir=str(tmp_path / "logs"),
                    store=kw.pop("store", str(tmp_path / "store")), threads=kw.pop("threads", 1),
                    extra=kw.pop("extra", {"scheduler": {"liveness-timeout-s": "2"}}),
                    env={"DUALPATH_HEARTBEAT_S": "0.2", **kw.pop("env", {})}, **kw)
    return Mesh(spec)


class Announcements:
    """Collects the latest EngineAnnounce per engine from `{ns}.hb`, in a background thread."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh
        self.engines: dict[str, EngineAnnounce] = {}
        self.history: list[tuple[float, str, int, int]] = []  # (time, engine, seq, free_blocks)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._ready = threading.Event()

    async def _run(self) -> None:
        nc = await nats.connect(self.mesh.nats_url)
        dec = msgspec.msgpack.Decoder(Announce)

        async def on(m):
            msg = dec.decode(m.data)
            if isinstance(msg, EngineAnnounce):
                self.engines[msg.engine] = msg
                self.history.append((time.monotonic(), msg.engine, msg.seq, msg.free_blocks))

        await nc.subscribe(EP.HEARTBEAT.at(self.mesh.spec.namespace), cb=on)
        self._ready.set()
        while not self._stop.is_set():
            await asyncio.sleep(0.05)
        await nc.close()

    def __enter__(self) -> "Announcements":
        self._thread.start()
        self._ready.wait(5)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def free_blocks(self) -> dict[str, int]:
        return {e: a.free_blocks for e, a in self.engines.items()}

    def wait_for(self, pred, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(self):
                return True
            time.sleep(0.1)
        return False


def complete(url: str, body: dict, path: str = "/v1/completions", timeout: float = 60.0) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=timeout)


def stream(url: str, body: dict, path: str = "/v1/completions", timeout: float = 60.0) -> list[dict | str]:
    """All SSE data payloads of a streamed request (JSON-decoded; "[DONE]" kept as a string)."""
    out: list[dict | str] = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=timeout) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


@contextmanager
def running(mesh: Mesh):
    mesh.start(timeout=120)
    try:
        yield mesh
    finally:
        mesh.stop()


def wait_until(pred, what: str, timeout: float = 30.0, interval: float = 0.05):
    """Poll `pred()` until it returns something truthy, and return that. `timeout` is only a hang
    guard: past it, an AssertionError names `what` and the last value `pred()` gave."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"gave up after {timeout:g}s waiting for {what} (last: {got!r})")
        time.sleep(interval)


def wait_stored(store, keys: list[bytes], timeout: float = 30.0) -> None:
    """Wait until every block of `keys` (as `prompt_keys` gives them) is a file in the
    directory store `store`. Persistence is background work; a block's file appears (by rename)
    only once complete, and a file is what a lookup sees."""
    from pathlib import Path

    def missing() -> list[str]:
        have = {p.stem for p in Path(store).rglob("*.kvb")}
        return [k.hex() for k in keys if k.hex() not in have]

    wait_until(lambda: not missing(), f"{len(keys)} blocks stored under {store}", timeout)


def metric_samples(url: str, name: str = r"dualpath_\w+") -> dict[str, float]:
    """Every sample of one /metrics page whose name matches `name`: {'name{labels}': value}."""
    out = {}
    for line in httpx.get(url, timeout=10).text.splitlines():
        m = re.match(rf"^({name})(\{{[^}}]*\}})? ([0-9.e+-]+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out
