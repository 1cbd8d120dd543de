"""Storage bytes read per node over time, scraped from every storage-gateway's /metrics."""
from __future__ import annotations

import re
import threading
import time

import httpx

_SAMPLE = re.compile(r'^dualpath_storage_gateway_(read_bytes_total|blocks_total)\{([^}]*)\}\s+([0-9.eE+-]+)', re.M)


def parse_metrics(text: str) -> tuple[dict[str, float], float]:
    """Prometheus text -> ({node: read bytes}, blocks read)."""
    by_node: dict[str, float] = {}
    blocks = 0.0
    for name, labels, value in _SAMPLE.findall(text):
        lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if name == "read_bytes_total":
            by_node[lab.get("node", "?")] = by_node.get(lab.get("node", "?"), 0.0) + float(value)
        elif lab.get("outcome") == "read":
            blocks += float(value)
    return by_node, blocks


class Poller:
    """Polls a mesh's /metrics pages every `period_s` in a thread, and on entry and exit; subclasses
    name the pages (`discover`) and what a poll keeps (`scrape_once`)."""

    def __init__(self, url: str, period_s: float, name: str):
        self.url, self.period = url, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        # one client for every poll: a fresh httpx.get builds an SSL context (the CA bundle) each
        # time, which cost the bench process ~30% of a core at 5 polls/s per gateway
        self._http = httpx.Client(timeout=2)

    def discover(self) -> None:
        raise NotImplementedError

    def scrape_once(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self.scrape_once()

    def __enter__(self):
        self.discover()
        self.scrape_once()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        self.scrape_once()
        self._http.close()


class Scraper(Poller):
    """Every gateway's storage reads (bytes and blocks per node), sampled through the run."""

    def __init__(self, url: str, period_s: float = 0.5):
        super().__init__(url, period_s, "bench-scrape")
        self.samples: list[tuple[float, str, float, float]] = []  # (unix time, node, read bytes, blocks)
        self.gateways: list[tuple[str, str]] = []  # (node, metrics url)

    def discover(self) -> None:
        mesh = self._http.get(self.url + "/v1/mesh", timeout=10).json()
        self.gateways = sorted({(g["node"], g["metrics_url"]) for g in mesh.get("gateways", []) if g.get("metrics_url")})

    def scrape_once(self) -> None:
        now = time.time()
        for node, murl in self.gateways:
            try:
                by_node, blocks = parse_metrics(self._http.get(murl).text)
            except httpx.HTTPError:
                continue
            self.samples.append((now, node, by_node.get(node, sum(by_node.values())), blocks))

    def _at(self, node: str, t: float) -> tuple[float, float]:
        """(bytes, blocks) of the last sample of `node` at or before t (the first after, if none)."""
        rows = [s for s in self.samples if s[1] == node]
        before = [s for s in rows if s[0] <= t]
        s = before[-1] if before else (rows[0] if rows else (t, node, 0.0, 0.0))
        return s[2], s[3]

    def window(self, t0: float, t1: float) -> tuple[dict[str, float], float]:
        """({node: bytes read in [t0, t1]}, bytes per block read in the window (0 if none))."""
        out, nbytes, nblocks = {}, 0.0, 0.0
        for node, _ in self.gateways:
            b0, k0 = self._at(node, t0)
            b1, k1 = self._at(node, t1)
            out[node] = b1 - b0
            nbytes, nblocks = nbytes + b1 - b0, nblocks + k1 - k0
        return out, (nbytes / nblocks if nblocks else 0.0)

    def series(self, t0: float, t1: float) -> dict[str, list[tuple[float, float]]]:
        """Per node, (seconds since t0, bytes read since t0) for the samples in [t0, t1]."""
        out: dict[str, list[tuple[float, float]]] = {}
        for node, _ in self.gateways:
            b0, _ = self._at(node, t0)
            out[node] = [(0.0, 0.0)] + [(s[0] - t0, s[2] - b0) for s in self.samples
                                        if s[1] == node and t0 <= s[0] <= t1]
        return out
