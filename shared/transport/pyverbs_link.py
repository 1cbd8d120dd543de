"""`python -m shared.transport.pyverbs_link`: make the system's pyverbs importable from the venv.

Owns one install step (`make install` runs it). pyverbs is not on PyPI: Debian ships it
as `python3-pyverbs`, compiled for the system Python, in /usr/lib/python3/dist-packages.
A venv does not see that directory, and adding all of it (a .pth line) would let every
Debian package shadow a missing venv dependency. So this links the one `pyverbs` package
into the venv's site-packages, and only when its extension modules were built for this
interpreter's ABI (same `EXT_SUFFIX`, e.g. `.cpython-311-x86_64-linux-gnu.so`: Debian's
3.11.2 build loads in a pyenv 3.11.7 venv; a 3.12 venv would need pyverbs built for 3.12).

Example: `link()` -> ("linked", ".venv/lib/python3.11/site-packages/pyverbs -> /usr/lib/
python3/dist-packages/pyverbs"); without the Debian package -> ("absent", "... apt-get
install python3-pyverbs ..."). It never fails the install: no pyverbs means no verbs backend.
"""

from __future__ import annotations

import os
import sys
import sysconfig

SYSTEM_PYVERBS = "/usr/lib/python3/dist-packages/pyverbs"


def abi_matches(pkg: str, ext_suffix: str) -> bool:
    """Whether `pkg` holds extension modules built for `ext_suffix`."""
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
