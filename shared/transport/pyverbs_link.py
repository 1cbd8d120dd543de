"""`python -m shared.transport.pyverbs_link`: make the system's pyverbs importable from the venv."""

from __future__ import annotations

import os
import sys
import sysconfig

SYSTEM_PYVERBS = "/usr/lib/python3/dist-packages/pyverbs"


def abi_matches(pkg: str, ext_suffix: str) -> bool:
    exts = [n for n in os.listdir(pkg) if n.endswith(".so")]
    return bool(exts) and any(n.endswith(ext_suffix) for n in exts)


def link(system_pkg: str = SYSTEM_PYVERBS, site: str | None = None, ext_suffix: str | None = None) -> tuple[str, str]:
    """Link `system_pkg` into `site`; returns (outcome, detail), outcome in linked | present | absent | abi."""
    site = site or sysconfig.get_paths()["purelib"]
    ext_suffix = ext_suffix or sysconfig.get_config_var("EXT_SUFFIX")
    dest = os.path.join(site, "pyverbs")
    if not os.path.isdir(system_pkg):
        return "absent", f"{system_pkg} not found (apt-get install python3-pyverbs); the verbs backend stays off"
    if not abi_matches(system_pkg, ext_suffix):
        return "abi", (f"{system_pkg} was not built for this Python ({sys.version.split()[0]}, {ext_suffix}); "
                       "build pyverbs (rdma-core) for it to use the verbs backend")
    if os.path.islink(dest) and os.readlink(dest) == system_pkg:
        return "present", f"{dest} -> {system_pkg}"
    if os.path.lexists(dest):
        if not os.path.islink(dest):
            return "present", f"{dest} is a pyverbs installed some other way; left alone"
        os.unlink(dest)  # a stale link (the package moved)
    os.symlink(system_pkg, dest)
    return "linked", f"{dest} -> {system_pkg}"


def main() -> None:
    outcome, detail = link()
    print(f"pyverbs: {outcome}: {detail}")


if __name__ == "__main__":
    main()
