"""What an audit is asked to do: :class:`AuditOptions`, the one source of the settings of
:func:`attnaudit.audit`, :func:`attnaudit.intervene` and the ``attnaudit`` command's flags.

A setting has one name everywhere: the field ``explorer_examples`` is the flag
``--explorer-examples`` (``_`` becomes ``-``); a repeatable flag takes the singular
(``sites`` is ``--site``, ``heads`` is ``--head``; :data:`REPEATED_FLAGS`). Settings are
grouped as httpx groups its Timeout and Limits: :class:`Edits` (what the interventions
edit), :class:`AttributionSettings`, :class:`Tolerances` (the validity thresholds) and
:class:`Loading` (how a Hugging Face model is batched and decoded). tests/cli holds the
flags and the fields in step.

This module imports only the standard library (the command line parses, and answers
``--help``, without torch), so the defaults the command line shows are written here and
tests/test_options.py holds them equal to the library's own constants.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from attnaudit.errors import OptionError

# The library's defaults, as the command line shows them (tests/test_options.py: each is the
# value of the library constant of that name).
QUICK_PERMUTATIONS = 20  # auditing.intervention_suite: permutations per row, quick
N_PERMUTATIONS = 100  # interventions.permutation: permutations per row
DEFAULT_EXPLORER_EXAMPLES = 5  # report.explorer.DEFAULT_EXAMPLES
DEFAULT_MAX_MASKED_MASS = 1e-6  # validity.analysers
WORK_BUDGET = 2e12  # interventions.work_budget: multiply-adds per protocol and example
DEFAULT_ROW_SUM_TOLERANCE = None  # validity.analysers: from the weights' dtype and key count
DECODING_MODES = ("model", "greedy")  # targets.decoding
ATTRIBUTION_OUTPUTS = ("prob", "logprob", "logit", "entropy", "contrast",
                       "contrast_logit")  # attribution.step_gradients.OUTPUTS
ATTRIBUTION_METHODS = ("saliency", "input_x_gradient", "integrated_gradients", "occlusion",
                       "deeplift", "gradient_shap")  # attribution.options.ALL_METHODS
ATTRIBUTION_VARIANTS = ("attnaudit", "inseq")
DTYPES = ("float32", "bfloat16", "float16")
ALIGNMENT_MEASURES = ("weights", "value_norm", "alti", "rollout", "alti_layer",
                      "value_zeroing", "value_zeroing_raw", *ATTRIBUTION_METHODS,
                      "loo")  # alignments.maps.MEASURES
ALIGNMENT_COMBINED = "mean"  # alignments.maps.COMBINED: the mean over the layers
ALIGNMENT_UNITS = ("words", "tokens")  # alignments.units.UNITS
ALIGNMENT_CONVENTIONS = ("emit", "input")  # alignments.units.CONVENTIONS

# Repeatable flags are named in the singular: one value per occurrence.
REPEATED_FLAGS = {"sites": "--site", "heads": "--head"}


class AuditMode(enum.StrEnum):
    """How much an audit runs. ``checks``: only what the CI gate judges (``attnaudit
    check``); ``quick``: the whole audit, cheaper (no adversarial search, no integrated
    gradients unless named, :data:`QUICK_PERMUTATIONS` permutations per row); ``full``."""

    CHECKS = "checks"
    QUICK = "quick"
    FULL = "full"


def positive_count(name: str, value: Any, *, optional: bool = True) -> None:
    """Raise :class:`OptionError` unless ``value`` is a whole number >= 1 (or None when
    ``optional``): the one check of ``limit``, ``explorer_examples``, ``batch_size`` ..."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"{name} must be a positive number (a whole number >= 1), got "
                          f"{value!r}")


def _choice(name: str, value: Any, allowed: Sequence[str]) -> None:
    if value is not None and value not in allowed:
        raise OptionError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")


def _flag(name: str, value: Any) -> None:
    """Raise :class:`OptionError` unless ``value`` is True or False (a string such as "no" would
    read as true)."""
    if not isinstance(value, bool):
        raise OptionError(f"{name} must be True or False, got {value!r}")


def _names(name: str, value: Any, allowed: Sequence[Any] | None = None,
           kind: type = str) -> tuple[Any, ...] | None:
    """``value`` as a tuple of distinct ``kind`` values (among ``allowed``; a str not
    empty), or None."""
    if value is None:
        return None
    iterable = isinstance(value, Iterable) and not isinstance(value, Mapping)
    items = (value,) if isinstance(value, (str, int)) or not iterable else tuple(value)
    bad = [v for v in items if isinstance(v, bool) or not isinstance(v, kind) or v == ""
           or (allowed is not None and v not in allowed)]
    if bad or not items or len(set(items)) != len(items):
        among = f" among {', '.join(map(str, allowed))}" if allowed is not None else ""
        raise OptionError(f"{name} must be distinct {kind.__name__} values{among}, got "
                          f"{value!r}")
    return items


@dataclass(frozen=True)
class Edits:
    """What the intervention suite edits. sites: the edited attention sites (default every
    cross-attention site; a decoder-only model's self-attention); heads: only these heads
    at each edited site (default all); sequence_effects: also decode each source again with
    the uniform, zeroing and median permutation edits held at every step."""

    sites: tuple[str, ...] | None = None
    heads: tuple[int, ...] | None = None
    sequence_effects: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "sites", _names("sites", self.sites))
        _flag("sequence_effects", self.sequence_effects)
        heads = _names("heads", self.heads, kind=int)
        if heads is not None and min(heads) < 0:
            raise OptionError(f"heads must be head indices >= 0, got {self.heads!r}")
        object.__setattr__(self, "heads", heads)


@dataclass(frozen=True)
class AttributionSettings:
    """What the attribution methods explain and how. attribute: one of
    :data:`ATTRIBUTION_OUTPUTS` (the contrast outputs need a contrast output per source);
    attribution_variant: ``attnaudit`` (signed sums, pad baseline, attention held constant
    for saliency and input x gradient) or ``inseq``; target_side: attribute to the output
    prefix too; methods: those to run (None: saliency, input x gradient and, unless quick,
    integrated gradients)."""

    attribute: str = "prob"
    attribution_variant: str = "attnaudit"
    target_side: bool = False
    methods: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        _choice("attribute", self.attribute, ATTRIBUTION_OUTPUTS)
        _choice("attribution_variant", self.attribution_variant, ATTRIBUTION_VARIANTS)
        _flag("target_side", self.target_side)
        object.__setattr__(self, "methods",
                           _names("methods", self.methods, ATTRIBUTION_METHODS))


@dataclass(frozen=True)
class Tolerances:
    """The validity thresholds: the largest tolerated weight on an ineligible key, and of
    ``|row sum - 1|`` (None: per site from the weights' dtype and key count)."""

    max_masked_mass: float = DEFAULT_MAX_MASKED_MASS
    row_sum_tolerance: float | None = DEFAULT_ROW_SUM_TOLERANCE

    def __post_init__(self) -> None:
        for name in ("max_masked_mass", "row_sum_tolerance"):
            value = getattr(self, name)
            if value is None and name == "row_sum_tolerance":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not value >= 0 or value == float("inf"):
                raise OptionError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class Loading:
    """How a Hugging Face model or folder becomes a target (:func:`attnaudit.from_hf`;
    refused with a ready target, which batches and decodes its own way). None: from_hf's
    default. num_beams overrides the model's generation config; seed seeds a decoding
    that samples."""

    batch_size: int | None = None
    max_new_tokens: int | None = None
    max_source_tokens: int | None = None
    decoding: str | None = None
    num_beams: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_new_tokens", "max_source_tokens", "num_beams"):
            positive_count(name, getattr(self, name))
        _choice("decoding", self.decoding, DECODING_MODES)
        if self.seed is not None and (isinstance(self.seed, bool)
                                      or not isinstance(self.seed, int)):
            raise OptionError(f"seed must be a whole number, got {self.seed!r}")

    def given(self) -> dict[str, Any]:
        """The settings given, as :func:`attnaudit.from_hf` keywords (num_beams becomes
        ``generation={"num_beams": N}``)."""
        given = {f.name: getattr(self, f.name) for f in fields(self)
                 if getattr(self, f.name) is not None and f.name != "num_beams"}
        if self.num_beams is not None:
            given["generation"] = {"num_beams": self.num_beams}
        return given


@dataclass(frozen=True)
class AuditOptions:
    """Every setting of one audit (:func:`attnaudit.audit`, ``attnaudit report`` and
    ``check``) or intervention suite (:func:`attnaudit.intervene`, ``attnaudit intervene``).

    mode: :class:`AuditMode` (``--quick``; ``attnaudit check`` is ``checks``). limit: audit
    only the first N examples. device, dtype: run on this device (cpu, cuda, cuda:N, mps)
    and in this floating dtype (one of :data:`DTYPES`, or a ``torch.device`` /
    ``torch.dtype``). max_memory: the budget (bytes or ``"2GiB"``; default 1 GiB) of one
    chunk of edited sequences and of one query block of explicitly computed attention.
    explorer_examples: the first examples whose maps the report's attention explorer keeps.
    interventions: run the intervention suite (False: validity and checklist only; the
    command line always runs it). attribution: :class:`AttributionSettings`, or an
    :class:`attnaudit.attribution.options.AttributionOptions` for what no flag sets
    (reduction, baseline, detached methods); None: the default settings. gold: a Pharaoh
    file of gold alignments, one line per example in token units
    (:mod:`attnaudit.alignments.gold`), for the alignment error rate table of any target
    (a target's own ``gold_alignments`` are used without it). work_budget: the
    multiply-adds (parameters x tokens) each of the costliest protocols may spend per
    example before it runs less of its work (integrated gradients' points, the adversarial
    search's steps, leave-one-out's edits, value zeroing, the faithfulness rows;
    :mod:`attnaudit.interventions.work_budget`; ``math.inf``: no budget). Nothing binds on
    models below ~10M parameters.
    """

    mode: AuditMode = AuditMode.FULL
    limit: int | None = None
    device: Any = None
    dtype: Any = None
    max_memory: int | str | None = None
    explorer_examples: int = DEFAULT_EXPLORER_EXAMPLES
    interventions: bool = True
    edits: Edits = field(default_factory=Edits)
    attribution: Any = None
    tolerances: Tolerances = field(default_factory=Tolerances)
    loading: Loading = field(default_factory=Loading)
    gold: str | None = None
    work_budget: float = WORK_BUDGET

    def __post_init__(self) -> None:
        if self.gold is not None:
            if not isinstance(self.gold, (str, os.PathLike)) or os.fspath(self.gold) == "":
                raise OptionError(f"gold must be the path of a Pharaoh file, got "
                                  f"{self.gold!r}")
            object.__setattr__(self, "gold", os.fspath(self.gold))
        try:
            object.__setattr__(self, "mode", AuditMode(self.mode))
        except ValueError:
            raise OptionError(f"mode must be one of {', '.join(m.value for m in AuditMode)}, "
                              f"got {self.mode!r}") from None
        positive_count("limit", self.limit)
        budget = self.work_budget
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
            raise OptionError(f"work_budget must be a number of multiply-adds > 0 (inf: no "
                              f"budget), got {budget!r}")
        object.__setattr__(self, "work_budget", float(budget))
        positive_count("explorer_examples", self.explorer_examples, optional=False)
        _choice("dtype", self.dtype if isinstance(self.dtype, str) else None, DTYPES)
        _flag("interventions", self.interventions)
        memory = self.max_memory
        if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (int, str))
                                   or (isinstance(memory, int) and memory < 1)):
            raise OptionError(f"max_memory must be a byte count >= 1 or a size like 2GiB, "
                              f"got {self.max_memory!r}")
        for name, kind in (("edits", Edits), ("tolerances", Tolerances),
                           ("loading", Loading)):
            if not isinstance(getattr(self, name), kind):
                raise OptionError(f"{name} must be an attnaudit.options.{kind.__name__}, got "
                                  f"{getattr(self, name)!r}")

    @property
    def quick(self) -> bool:
        return self.mode is AuditMode.QUICK

    @property
    def checks_only(self) -> bool:
        return self.mode is AuditMode.CHECKS

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any],
                      base: AuditOptions | None = None) -> AuditOptions:
        """``base`` (default: the defaults) with the settings named by their flat names
        (:func:`setting_names`: ``limit``, ``sites``, ``attribute`` ...), or by the field
        names (``attribution``, ``edits`` ...), or ``quick`` and ``checks_only``, two of
        the modes as booleans, replaced: the one place where loose
        keywords and parsed flags become options. A setting given as None or at its
        default leaves ``base``'s value."""
        if not isinstance(settings, Mapping):
            raise OptionError(f"settings must be a mapping of setting names to values, got "
                              f"{settings!r}")
        if base is not None and not isinstance(base, AuditOptions):
            raise OptionError(f"options must be an attnaudit.AuditOptions (or None), got "
                              f"{base!r}")
        options = cls() if base is None else base
        unknown = (set(settings) - set(setting_names()) - {f.name for f in fields(cls)}
                   - {"quick", "checks_only"})
        if unknown:
            raise OptionError(f"unknown audit settings {sorted(unknown)}; the settings are "
                              f"{', '.join(setting_names())}")
        for mode in ("quick", "checks_only"):
            if settings.get(mode) is not None:
                _flag(mode, settings[mode])
        if settings.get("quick") and settings.get("checks_only"):
            raise OptionError("quick and checks_only are two modes: give one")
        top = _given(cls, settings)
        if settings.get("quick"):
            top["mode"] = AuditMode.QUICK
        if settings.get("checks_only"):
            top["mode"] = AuditMode.CHECKS
        for group in _GROUPS:
            given = _given(group.kind, settings)
            if given:
                current = top.get(group.name, getattr(options, group.name))
                if current is None:
                    current = group.kind()
                elif not isinstance(current, group.kind):
                    raise OptionError(f"{', '.join(sorted(given))} cannot be set beside "
                                      f"{group.name}={current!r}: give one or the other")
                top[group.name] = replace(current, **given)
        return replace(options, **top)


def _given(kind: type, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings among ``kind``'s fields given neither as None nor at their default."""
    defaults = kind()
    return {f.name: settings[f.name] for f in fields(kind)
            if settings.get(f.name) is not None
            and settings[f.name] != getattr(defaults, f.name)}


@dataclass(frozen=True)
class _Group:
    name: str
    kind: type


_GROUPS = (_Group("edits", Edits), _Group("attribution", AttributionSettings),
           _Group("tolerances", Tolerances), _Group("loading", Loading))


def setting_names() -> tuple[str, ...]:
    """Every setting's flat name: the top-level fields but the groups, then each group's
    fields (names are unique across groups, so one name is one setting)."""
    groups = {g.name for g in _GROUPS}
    return (*(f.name for f in fields(AuditOptions) if f.name not in groups),
            *(f.name for g in _GROUPS for f in fields(g.kind)))


def flag_of(name: str) -> str:
    """The command-line flag of the setting ``name``: ``--explorer-examples``,
    ``--site``."""
    return REPEATED_FLAGS.get(name, "--" + name.replace("_", "-"))
