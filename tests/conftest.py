"""Test session settings."""

import os
import tempfile
from pathlib import Path

# op timings the ``measured`` cost model takes (recompute.capture.timing.TimeCache): shared by the suite's
# workers and runs, kept out of the user's own cache
os.environ.setdefault("RECOMPUTE_CACHE_DIR", str(Path(tempfile.gettempdir()) / f"recompute-tests-{os.getuid()}"))
