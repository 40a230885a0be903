"""What an install without an optional extra is told, in one line.

``pip install attnaudit`` is the core (capture, analysers, interventions, the validity
pipeline: torch, numpy, pandas, tqdm); the extras of pyproject.toml add the rest, and
``attnaudit[all]`` every one of them. This module imports nothing beyond the standard
library, so that it can speak when those packages are missing.
"""

from __future__ import annotations

# Import names of the packages that only an extra installs (pyproject.toml's
# optional-dependencies attribution, report and hf; tests/test_packaging.py holds the two
# lists together).
EXTRA_PACKAGES = frozenset({"captum", "scipy", "seaborn", "matplotlib", "jinja2",
                            "transformers", "tokenizers", "safetensors", "accelerate"})
INSTALL_ALL = "pip install 'attnaudit[all]'"


def missing_extra(exc: BaseException, needed_by: str) -> str | None:
    """``"<needed_by> needs captum, which is not installed: pip install 'attnaudit[all]'"``
    when ``exc`` is the import of a package that an extra installs; None for any other
    error (a missing module of attnaudit itself is a bug, not an install to suggest)."""
    if not isinstance(exc, ModuleNotFoundError):
        return None
    package = (exc.name or "").partition(".")[0]
    if package not in EXTRA_PACKAGES:
        return None
    return f"{needed_by} needs {package}, which is not installed: {INSTALL_ALL}"
