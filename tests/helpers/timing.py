"""What two runs of one audit may differ in: the measured times, and the performance item's
status, which is judged from them (capture overhead against stated thresholds) and so
depends on the machine's load at the time."""

from __future__ import annotations

import pandas as pd

TIMED = {"performance", "performance_totals"}


def load_free(checklist: pd.DataFrame) -> pd.DataFrame:
    """The checklist table without the performance item's status."""
    out = checklist.copy()
    out.loc[out["item"] == "performance", "status"] = "(timed)"
    return out


def assert_same_untimed_tables(ours: dict[str, pd.DataFrame],
                               theirs: dict[str, pd.DataFrame]) -> None:
    """Two audits' tables are equal, times and the performance status aside."""
    assert set(ours) == set(theirs)
    for name in set(theirs) - TIMED:
        mine, other = ours[name], theirs[name]
        if name == "checklist":
            mine, other = load_free(mine), load_free(other)
        pd.testing.assert_frame_equal(mine, other, obj=name)
