"""Word alignments read from attention and importance maps, in the Pharaoh format, and their
alignment error rate (AER) against gold alignments."""

from attnaudit.alignments.aer import AlignmentCounts, count_links
from attnaudit.alignments.maps import MEASURES, alignment_maps
from attnaudit.alignments.pharaoh import Alignment, read_alignments, write_alignments
from attnaudit.alignments.run import aer_table, align

__all__ = [
    "MEASURES",
    "Alignment",
    "AlignmentCounts",
    "aer_table",
    "align",
    "alignment_maps",
    "count_links",
    "read_alignments",
    "write_alignments",
]
