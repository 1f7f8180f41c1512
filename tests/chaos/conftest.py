"""The chaos soak reuses the end-to-end helpers (``tests/e2e``: processes, fault proxy)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
