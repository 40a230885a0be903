"""The bundled date models, installed as the package ``attnaudit_examples``.

The folder ``examples/`` of the checkout is this package (``pip install -e .`` maps the name
onto it; a wheel carries it under that name), so that ``attnaudit demo`` and the default
target work wherever attnaudit is installed:

- ``attnaudit_examples.date``: an LSTM encoder-decoder with additive attention
  (``date_attention.pt``) and its no-attention baseline (``date_baseline.pt``);
- ``attnaudit_examples.date_transformer``: a small BART (the folder ``model/``) and its audit
  data (``audit.tsv``);
- ``attnaudit_examples.alignment_audit``: the date alignment audit of both.
"""

# From the checkout's root the folder is also reachable as ``examples``; a second name would
# load every module twice (two model classes, two checkpoints' worth of state), so it is
# refused rather than half-working.
if __name__ != "attnaudit_examples":
    raise ImportError(f"the bundled examples are the package attnaudit_examples, not "
                      f"{__name__}: import attnaudit_examples (from a checkout, after "
                      f"`pip install -e .`)")
