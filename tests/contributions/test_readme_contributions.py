"""The README's contributions example runs as written, and its results hold what the
comments say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Contributions, not just weights"


def test_the_readme_contributions_example_runs():
    pytest.importorskip("transformers")
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    (example,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    maps, result = namespace["maps"], namespace["result"]
    batch, emitted = namespace["batch"], namespace["emitted"]
    assert set(maps) == {"weights", "value_norm", "alti", "rollout"}
    assert {tuple(m.shape) for m in maps.values()} == {
        (8, 2, emitted.shape[1], batch.source_ids.shape[1])}
    assert [c.status for c in result.checks] == ["pass"] * 6
    share = namespace["alti_plus"](result).source_share
    assert bool(((share > 0) & (share <= 1 + 1e-5)).all())
    assert torch.isfinite(maps["alti"]).all()
