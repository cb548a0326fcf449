"""`python -m kvops.probe CONFIG_JSON` (or the JSON on stdin): run the probe on this machine."""

from __future__ import annotations

import json
import sys

from .main import run

if __name__ == "__main__":
    raw = sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read()
    sys.exit(run(json.loads(raw or "{}")))
