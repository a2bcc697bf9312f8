"""Golden baselines: exact cycles, warp-instructions and bytes per level of small runs on every
config (tests/golden_cases.py). Any change fails here; regenerate on purpose with
``python scripts/update_golden.py`` and say in the commit which figures moved and why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from golden_cases import CONFIGS, cases, measure

GOLDEN = Path(__file__).parent / "golden"


def test_every_config_has_a_golden_file():
    configs = sorted(p.stem for p in (Path(__file__).parent.parent / "configs").glob("*.yaml"))
    assert sorted(CONFIGS) == configs
    for c in CONFIGS:
        doc = json.loads((GOLDEN / f"{c}.json").read_text())
        assert doc["config"] == c and set(doc["cases"]) == {k[0] for k in cases(c)}


@pytest.mark.parametrize("config,case", [(c, k) for c in CONFIGS for k in cases(c)],
                         ids=lambda v: v if isinstance(v, str) else v[0])
def test_golden(config, case):
    want = json.loads((GOLDEN / f"{config}.json").read_text())["cases"][case[0]]
    got = measure(config, case)
    assert got == want, f"{config} {case[0]}: the figures moved (scripts/update_golden.py regenerates them on purpose)"
