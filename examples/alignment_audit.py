"""The seed's date alignment audit, for both bundled date models.

    python -m attnaudit_examples.alignment_audit                    # both models
    python -m attnaudit_examples.alignment_audit date               # the LSTM, additive attention
    python -m attnaudit_examples.alignment_audit date_transformer   # the small BART

For each model: the share of the first four emitted characters' cross-attention mass on the
source-year characters (``region_mass``) and how often their top-weighted key lies there
(``top_weight_hit``), over the first 400 unambiguous validation sources (the target's audit
data and its "source year" expectation), and exact match on the 437 unambiguous test
sources, printed beside the seed's 97.5 % / 99.7 % / 100.0 %. For ``date`` also the test exact
match of the seed's no-attention baseline (``examples/date/baseline.py``; seed: 93.1 %).

Protocol: each batch is decoded greedily first, without capture; then the teacher-forced
pass over that greedy output is captured (the default seq2seq protocol of docs/metrics.md), so
query row t of a cross-attention record is the step that emits character t. Every
cross-attention site is reported per head and averaged over heads (``head = -1``), with
the mean ``entropy_norm`` and ``max_weight`` of the same rows; the headline is the last
layer's head average (the single head of the LSTM).
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
import torch

import attnaudit
from attnaudit.analysis import (
    AttentionRows,
    EntropyAnalyser,
    RegionAnalyser,
    layer_of,
    mean_over_heads,
)
from attnaudit.analysis.alignment import MEAN_HEAD
from attnaudit.analysis.regions import HEAD_MEAN_SUFFIX
from attnaudit.targets.contract import Expectation, Seq2SeqTarget

from .date.data import make_splits

SEED = {"region_mass": 0.975, "top_weight_hit": 0.997, "exact_match": 1.0,
        "baseline_exact_match": 0.931}
EXPECTATION = "source year"
TABLE_COLUMNS = ["site", "layer", "head", "region_mass", "top_weight_hit", "entropy_norm",
                 "max_weight", "rows"]


@dataclass
class AlignmentAudit:
    """One model's audit.

    table: one row per cross-attention site x head (``head`` -1 = averaged over heads):
        region_mass, top_weight_hit, entropy_norm, max_weight (means over the counted
        rows, in [0, 1]) and ``rows``, the number of (source, step) rows counted.
    exact_match: share of the test pairs decoded exactly; n_test: their number.
    """

    name: str
    table: pd.DataFrame
    exact_match: float
    n_test: int
    n_sources: int

    def headline(self) -> pd.Series:
        """The last layer's head average (the only head of a single-head model)."""
        table = self.table
        if table["layer"].notna().any():
            table = table[table["layer"] == table["layer"].max()]
        return table.sort_values("head").iloc[0]


def cross_sites(name: str) -> bool:
    return name.endswith(":cross")


def _expectation(target: Seq2SeqTarget, name: str) -> Expectation:
    for expectation in target.expectations:
        if expectation.name == name:
            return expectation
    raise ValueError(f"target {target.name!r} has no expectation {name!r}")


def region_table(target: Seq2SeqTarget, expectation: str = EXPECTATION,
                 limit: int | None = None) -> tuple[pd.DataFrame, int]:
    """Region metrics per cross-attention site x head, and the number of sources audited."""
    expected = _expectation(target, expectation)
    regions, entropy = RegionAnalyser(), EntropyAnalyser()
    sources = 0
    for batch in target.iter_batches(limit):
        with torch.no_grad():
            emitted = target.greedy(batch)
            with attnaudit.capture(target.model, sites=target.sites or cross_sites,
                                   kinds=target.kinds) as cap:
                target.teacher_forced(batch, emitted)
        keys = expected.keys(batch, emitted)
        for record in cap.records.values():
            if record.kind != "cross":
                continue
            views = [AttentionRows.of(record)]
            if views[0].weights.shape[1] > 1:
                views.append(mean_over_heads(views[0]))
            for view in views:
                regions.update(view, expected=keys, rows=expected.rows)
                entropy.update(_first_rows(view, expected.rows))
        sources += len(batch)
    return _summary(regions.compute(), entropy.compute()), sources


def _first_rows(rows: AttentionRows, n: int | None) -> AttentionRows:
    """The first ``n`` query rows of ``rows`` (all when None)."""
    keep = slice(None, n)
    return AttentionRows(rows.site, rows.kind, rows.weights[:, :, keep], rows.eligible[:, :, keep],
                rows.step_offset)


def _summary(regions: pd.DataFrame, entropy: pd.DataFrame) -> pd.DataFrame:
    """Per site x head: the mean of each metric over all counted rows (every step pooled)."""
    frame = pd.concat([regions, entropy[entropy["metric"].isin(["entropy_norm", "max_weight"])]])
    pooled = frame.groupby(["site", "head", "metric"])[["sum", "n"]].sum()
    wide = (pooled["sum"] / pooled["n"]).unstack("metric")
    rows = pooled["n"].unstack("metric")["region_mass"]
    out = wide.assign(rows=rows.astype(int)).reset_index()
    averaged = out["site"].str.endswith(HEAD_MEAN_SUFFIX)
    out.loc[averaged, "head"] = MEAN_HEAD
    out["site"] = out["site"].str.removesuffix(HEAD_MEAN_SUFFIX)
    out["layer"] = out["site"].map(layer_of).astype("Int64")
    out.columns.name = None
    return out[TABLE_COLUMNS].sort_values(["layer", "site", "head"], ignore_index=True)


def date_exact_match(model: torch.nn.Module, pairs: Sequence[tuple[str, str]]) -> float:
    """Share of ``(source, iso)`` pairs the date LSTM decodes greedily to ``iso`` exactly."""
    from .date.data import vocabularies
    from .date.train import exact_match

    return exact_match(model, list(pairs), *vocabularies(make_splits()))


def bart_exact_match(model: torch.nn.Module, pairs: Sequence[tuple[str, str]]) -> float:
    """Share of ``(source, iso)`` pairs the date BART decodes greedily to ``iso`` exactly."""
    from transformers import AutoTokenizer

    from .date_transformer.model import MODEL_DIR, exact_match

    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR, local_files_only=True)
    return exact_match(model, tokenizer, list(pairs))


def audit(target: Seq2SeqTarget, exact: Callable[[torch.nn.Module, Sequence], float],
          limit: int | None = None) -> AlignmentAudit:
    """Region table over the target's audit data and exact match on the unambiguous test."""
    table, sources = region_table(target, limit=limit)
    test = make_splits().unambiguous("test")
    return AlignmentAudit(target.name, table, exact(target.model, test), len(test), sources)


def audit_date(limit: int | None = None) -> AlignmentAudit:
    from .date.target import make_target

    return audit(make_target(), date_exact_match, limit)


def audit_date_transformer(limit: int | None = None) -> AlignmentAudit:
    from .date_transformer.target import make_target

    return audit(make_target(), bart_exact_match, limit)


AUDITS = {"date": audit_date, "date_transformer": audit_date_transformer}


def format_headline(result: AlignmentAudit) -> str:
    """The three numbers beside the seed's."""
    top = result.headline()
    where = f"{top['site']}, " + ("averaged over heads" if top["head"] == MEAN_HEAD
                                   else f"head {top['head']}")
    lines = [f"{result.name}: {where}; teacher-forced on its greedy output",
             f"{'':48}{'attnaudit':>10}{'seed':>8}"]
    for label, value, seed in (
        (f"year-region mass, first 4 rows ({result.n_sources} valid)", top["region_mass"],
         SEED["region_mass"]),
        ("top-weight hit rate in year region", top["top_weight_hit"], SEED["top_weight_hit"]),
        (f"exact match, {result.n_test} unambiguous test sources", result.exact_match,
         SEED["exact_match"]),
    ):
        lines.append(f"  {label:46}{value:>10.1%}{seed:>8.1%}")
    return "\n".join(lines)


def format_baseline(result: AlignmentAudit) -> str:
    """The date model's test exact match beside its no-attention baseline's, and the seed's."""
    from .date.baseline import load_baseline
    from .date.model import load_model

    baseline = load_baseline()
    baseline_exact = date_exact_match(baseline, make_splits().unambiguous("test"))
    lines = [f"{result.name} and the seed's no-attention baseline, {result.n_test} unambiguous "
             "test sources",
             f"  {'model':32}{'parameters':>12}{'test exact match':>18}{'seed':>8}"]
    for label, model, value, seed in (
        ("LSTM + additive attention", load_model(), result.exact_match, SEED["exact_match"]),
        ("LSTM, no attention (baseline)", baseline, baseline_exact,
         SEED["baseline_exact_match"]),
    ):
        n_params = sum(p.numel() for p in model.parameters())
        lines.append(f"  {label:32}{n_params:>12,}{value:>18.1%}{seed:>8.1%}")
    return "\n".join(lines)


def format_table(result: AlignmentAudit) -> str:
    """Every cross-attention site and head (head -1: averaged over heads)."""
    shown = result.table.drop(columns="site").copy()
    shown["layer"] = shown["layer"].map(lambda layer: "-" if pd.isna(layer) else str(layer))
    shown["head"] = shown["head"].map(lambda h: "mean" if h == MEAN_HEAD else str(h))
    for column in ("region_mass", "top_weight_hit", "entropy_norm", "max_weight"):
        shown[column] = shown[column].map("{:.1%}".format)
    return shown.to_string(index=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m attnaudit_examples.alignment_audit",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", choices=[*AUDITS, "both"], default="both")
    args = parser.parse_args(argv)
    for name in AUDITS if args.model == "both" else [args.model]:
        if name == "date_transformer" and importlib.util.find_spec("transformers") is None:
            print("date_transformer: skipped, it needs the hf extra "
                  "(pip install -e '.[hf]')\n")
            continue
        result = AUDITS[name]()
        print(format_headline(result))
        print(format_table(result))
        if name == "date":
            print(f"\n{format_baseline(result)}")
        print()


if __name__ == "__main__":
    main()
