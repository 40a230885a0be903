"""Validity: is this a valid weighted retrieval computation? The pipeline (target ->
capture -> analysers), the per-site findings it produces, and the gate that judges them."""
