"""Streaming analysers over attention records (definitions: docs/metrics.md)."""

from attnaudit.analysis.aggregation import (
    aggregate,
    group_labels,
    span_groups,
    words_from_offsets,
    words_from_tokens,
)
from attnaudit.analysis.alignment import AlignmentAnalyser
from attnaudit.analysis.base import Analyser, AttentionRows
from attnaudit.analysis.entropy import EntropyAnalyser
from attnaudit.analysis.expectations import (
    char_offsets,
    expected_from_callable,
    expected_from_spans,
    keys_from_char_spans,
    keys_from_word_spans,
    read_pharaoh,
)
from attnaudit.analysis.masking import MaskingAnalyser
from attnaudit.analysis.numerics import NumericsAnalyser
from attnaudit.analysis.regions import RegionAnalyser, mean_over_heads
from attnaudit.analysis.scores import ScoreAnalyser
from attnaudit.analysis.stats import MetricSpec, RowStats, layer_of

__all__ = [
    "AlignmentAnalyser",
    "Analyser",
    "AttentionRows",
    "EntropyAnalyser",
    "MaskingAnalyser",
    "MetricSpec",
    "NumericsAnalyser",
    "RegionAnalyser",
    "RowStats",
    "ScoreAnalyser",
    "aggregate",
    "char_offsets",
    "expected_from_callable",
    "expected_from_spans",
    "group_labels",
    "keys_from_char_spans",
    "keys_from_word_spans",
    "layer_of",
    "mean_over_heads",
    "read_pharaoh",
    "span_groups",
    "words_from_offsets",
    "words_from_tokens",
]
