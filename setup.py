"""Which packages the distribution holds; everything else is in pyproject.toml.

The folder ``examples/`` installs as the package ``attnaudit_examples`` (the bundled date
models behind ``attnaudit demo`` and the default target). pyproject.toml's package finder
names a package after its folder, so this renaming is spelled out here, once.
"""

from setuptools import find_packages, setup

EXAMPLES = "attnaudit_examples"

setup(
    packages=[*find_packages(include=["attnaudit", "attnaudit.*"]),
              EXAMPLES, *(f"{EXAMPLES}.{name}" for name in find_packages("examples"))],
    package_dir={EXAMPLES: "examples"},
)
