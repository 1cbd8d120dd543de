"""Making Debian's pyverbs importable from the venv, and saying which transport was chosen and why."""

import os

import pytest

from shared.transport.pyverbs_link import link
from shared.transport.registry import choose, create_endpoint
from shared.transport.verbs import probe

pytestmark = pytest.mark.unit
EXT = ".cpython-311-x86_64-linux-gnu.so"


def fake_pkg(root, *files: str) -> str:
    pkg = root / "dist" / "pyverbs"
    pkg.mkdir(parents=True)
    for name in ("__init__.py", *files):
        (pkg / name).write_text("")
    return str(pkg)


def test_links_the_system_package_when_its_abi_matches(tmp_path):
    pkg, site = fake_pkg(tmp_path, "device" + EXT), tmp_path / "site"
    site.mkdir()
    assert link(pkg, str(site), EXT)[0] == "linked"
    assert os.readlink(site / "pyverbs") == pkg
    assert link(pkg, str(site), EXT)[0] == "present"  # idempotent


def test_refuses_a_package_built_for_another_python(tmp_path):
    pkg, site = fake_pkg(tmp_path, "device.cpython-312-x86_64-linux-gnu.so"), tmp_path / "site"
    site.mkdir()
    outcome, detail = link(pkg, str(site), EXT)
    assert outcome == "abi" and EXT in detail
    assert not os.path.lexists(site / "pyverbs")


def test_absent_package_names_the_apt_package(tmp_path):
    outcome, detail = link(str(tmp_path / "nope"), str(tmp_path), EXT)
    assert outcome == "absent" and "python3-pyverbs" in detail


def test_a_stale_link_is_replaced_and_a_real_install_left_alone(tmp_path):
    pkg, site = fake_pkg(tmp_path, "device" + EXT), tmp_path / "site"
    site.mkdir()
    os.symlink(str(tmp_path / "moved"), site / "pyverbs")
    assert link(pkg, str(site), EXT)[0] == "linked" and os.readlink(site / "pyverbs") == pkg
    os.unlink(site / "pyverbs")
    (site / "pyverbs").mkdir()
    assert link(pkg, str(site), EXT)[0] == "present" and not os.path.islink(site / "pyverbs")


def test_verbs_probe_reason_is_about_the_device_once_pyverbs_is_installed():
    if not os.path.isdir("/usr/lib/python3/dist-packages/pyverbs"):
        pytest.skip("python3-pyverbs is not installed on this host")
    reason = probe()
    assert reason is None or reason.startswith("no RDMA device"), reason


def test_endpoints_say_which_backend_was_chosen_and_why():
    explicit = create_endpoint("tcp", node="t")
    auto = create_endpoint("auto", node="a")
    try:
        assert explicit.why == "requested"
        name, why = choose("auto")
        assert (auto.backend, auto.why) == (name, why)
        assert why.startswith("auto: ") and (name == "verbs" or (probe() or "?") in why)
    finally:
        explicit.close_local()  # type: ignore[attr-defined]
        auto.close_local()  # type: ignore[attr-defined]
    assert choose("shm") == ("shm", "requested")
