"""Regenerate the golden baselines (tests/golden/<config>.json) from the current code, on purpose:

    python scripts/update_golden.py              # every config in tests/golden_cases.CONFIGS
    python scripts/update_golden.py tiny-gpu     # one config

A commit that changes these files says which figures moved and why (tests/test_golden.py fails
on any difference until then).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from golden_cases import CONFIGS, cases, measure  # noqa: E402


def main(argv: list[str]) -> int:
    for config in argv or CONFIGS:
        t0 = time.perf_counter()
        doc = {"schema": "archsim.golden/1", "config": config,
               "cases": {c[0]: measure(config, c) for c in cases(config)}}
        path = ROOT / "tests" / "golden" / f"{config}.json"
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"{path.relative_to(ROOT)}: {len(doc['cases'])} cases in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
