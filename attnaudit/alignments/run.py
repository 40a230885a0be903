"""Word alignments of a target's data (:func:`align`) and their error rate against gold
alignments for every measure, layer and step convention (:func:`aer_table`).

Batches are read one at a time; only the links are kept, so memory does not grow with the
data beyond one batch's maps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pandas as pd
import torch

from attnaudit.alignments.aer import AlignmentCounts, count_links
from attnaudit.alignments.extract import links_from_maps
from attnaudit.alignments.maps import COMBINED, WEIGHTS, alignment_maps, check_measures, layer_map
from attnaudit.alignments.pharaoh import Alignment
from attnaudit.alignments.units import CONVENTIONS, DEFAULT_CONVENTION, batch_units
from attnaudit.attribution.options import AttributionOptions
from attnaudit.errors import AlignmentError
from attnaudit.targets.contract import Seq2SeqTarget

AER_COLUMNS = ["measure", "layer", "convention", "aer", "precision", "recall", "links",
               "sure", "sentences"]
Setting = tuple[str, str, str]  # (measure, layer label, convention)


def _layers(n_layers: int, layer: int | str | None) -> list[int | str]:
    """The layers to read: one, or (None) every layer and, with several, their mean."""
    if layer is not None:
        return [layer]
    return list(range(n_layers)) + ([COMBINED] if n_layers > 1 else [])


def _batch_links(target: Seq2SeqTarget, measures: Sequence[str], layer: int | str | None,
                 units: str, conventions: Sequence[str], limit: int | None,
                 attribution: AttributionOptions | None, max_memory: int | str | None
                 ) -> Iterator[dict[Setting, list[Alignment]]]:
    """Per batch, the links of every (measure, layer, convention) asked for."""
    measures = check_measures(measures)
    for batch in target.iter_batches(limit):
        with torch.no_grad():
            emitted = target.greedy(batch)
        maps = alignment_maps(target, batch, emitted, measures, attribution, max_memory)
        found: dict[Setting, list[Alignment]] = {}
        for convention in conventions:
            batch_units_ = batch_units(target, batch, emitted, units, convention)
            for measure, stacked in maps.items():
                for at in _layers(stacked.shape[1], layer):
                    links = links_from_maps(layer_map(stacked, at), batch_units_)
                    found[(measure, str(at), convention)] = links
        yield found


def align(target: Seq2SeqTarget, measure: str = WEIGHTS, layer: int | str = COMBINED, *,
          units: str = "words", convention: str = DEFAULT_CONVENTION, limit: int | None = None,
          attribution: AttributionOptions | None = None,
          max_memory: int | str | None = None) -> list[Alignment]:
    """Word alignments of ``target``'s data (its greedy outputs), one per example.

    Args:
        target: the audit target; its data's sources are aligned to its greedy outputs.
        measure: one of :data:`~attnaudit.alignments.maps.MEASURES`.
        layer: a layer index of the measure, or ``"mean"`` (the mean over its layers).
        units: ``words`` (subwords merged by the word rules) or ``tokens``
            (:mod:`attnaudit.alignments.units`).
        convention: ``emit`` (output token j is read at the step that emits it; the
            default, as on the command line) or ``input`` (at the step where it is the
            decoder's input).
        limit: the first ``limit`` examples.
        attribution: options of the gradient measures. max_memory: their and
            leave-one-out's chunk budget.

    Returns one :class:`~attnaudit.alignments.pharaoh.Alignment` per example (sure links
    only), source word i - target word j.
    """
    out: list[Alignment] = []
    for found in _batch_links(target, [measure], layer, units, [convention], limit,
                              attribution, max_memory):
        out.extend(next(iter(found.values())))
    return out


def aer_table(target: Seq2SeqTarget, gold: Sequence[Alignment],
              measures: Sequence[str] = (WEIGHTS,), *, units: str = "words",
              conventions: Sequence[str] = CONVENTIONS, layer: int | str | None = None,
              limit: int | None = None, attribution: AttributionOptions | None = None,
              max_memory: int | str | None = None) -> pd.DataFrame:
    """AER, precision and recall (:mod:`attnaudit.alignments.aer`) of every measure, layer
    (``layer`` None: each one and their mean) and step convention against ``gold``, one
    gold alignment per example of the data (the first ``limit``).

    Returns one row per setting with :data:`AER_COLUMNS` (``links`` |A|, ``sure`` |S|).
    """
    counts: dict[Setting, AlignmentCounts] = {}
    seen = 0
    for found in _batch_links(target, measures, layer, units, conventions, limit,
                              attribution, max_memory):
        size = len(next(iter(found.values())))
        if seen + size > len(gold):
            raise AlignmentError(f"the gold alignments have {len(gold)} lines but the data "
                                 f"has more examples; give one line per example")
        for setting, links in found.items():
            counts[setting] = counts.get(setting, AlignmentCounts()) + count_links(
                links, gold[seen:seen + size])
        seen += size
    if seen != len(gold) and limit is None:
        raise AlignmentError(f"the gold alignments have {len(gold)} lines but the data has "
                             f"{seen} examples; give one line per example")
    return pd.DataFrame([{"measure": m, "layer": layer_, "convention": c, "aer": n.aer,
                          "precision": n.precision, "recall": n.recall,
                          "links": n.predicted, "sure": n.sure, "sentences": n.sentences}
                         for (m, layer_, c), n in counts.items()], columns=AER_COLUMNS)
