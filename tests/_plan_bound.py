"""A ``plan --p99-ms`` bound that does not depend on the machine's load (issue 26)."""

from __future__ import annotations

import json
import math
from pathlib import Path

__all__ = ["plan_bound"]


def plan_bound(tune_json: Path) -> float:
    """``plan``'s p99 bound for a tune's ``tune.json``: twice the largest p99 the tune measured
    (whole ms), so every measured configuration meets it whatever the machine's load was."""
    data = json.loads(tune_json.read_text())
    worst = max(float(r["p99_ms"]) for r in data["trials"] if r.get("p99_ms") is not None)
    return float(math.ceil(2 * worst))
