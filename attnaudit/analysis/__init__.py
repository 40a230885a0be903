"""Streaming analysers over attention records (definitions: METRICS.md)."""

from attnaudit.analysis.base import Analyser, Rows
from attnaudit.analysis.entropy import EntropyAnalyser
from attnaudit.analysis.masking import MaskingAnalyser
from attnaudit.analysis.numerics import NumericsAnalyser
from attnaudit.analysis.stats import MetricSpec, RowStats, layer_of

__all__ = [
    "Analyser",
    "EntropyAnalyser",
    "MaskingAnalyser",
    "MetricSpec",
    "NumericsAnalyser",
    "RowStats",
    "Rows",
    "layer_of",
]
