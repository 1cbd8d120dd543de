"""Settings for the whole test run."""
from __future__ import annotations

import os
import tempfile

# benchmarks run inside tests take a lock of this run's own, not the machine's: a benchmark a
# developer runs beside the suite is refused by its own lock, and the suite never waits on it
os.environ.setdefault("DUALPATH_BENCH_LOCK", os.path.join(tempfile.mkdtemp(prefix="dualpath-test-"), "bench.lock"))
