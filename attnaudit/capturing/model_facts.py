"""Model facts: what capture and a target must know of an architecture that its code does
not say in a form they can read, held as data.

Which softmaxes of a model are attention, and which are self- and which cross-attention,
are decided in one order, the first that says something winning (sink names add up; how
many leading positions a model prepends and how it builds its input from the ids come from
its entry alone, the defaults without one):

1. the user's override for one capture: ``capture(model, include=..., exclude=...,
   roles=...)`` (:class:`SiteRules`), and ``kinds=`` by exact site name;
2. the model's entry in the table of model facts (:class:`ModelFacts`), looked up by
   architecture: the ``config.model_type`` of any of its modules that has a Hugging Face
   config, and the class name of the model itself (its class name's entry first, when
   both have one); an entry registered with :func:`register_model_facts` replaces a
   built-in one for the same architecture;
3. the generic heuristics: the role rules (:data:`attnaudit.capturing.roles.ROLE_RULES`),
   the cross-attention name words (:func:`attnaudit.capturing.sites.kind_from_name`), the
   layout and sink names read at the call site. Each is listed in :data:`HEURISTICS` with
   the code it serves and a test that fails without it.

Patterns are shell-style (``fnmatch``: ``*``, ``?``, ``[...]``, case-sensitive) and match a
site when they match the whole of its module's path (``model.layers.0.mlp.router``; a
``torch.compile`` wrapper's ``_orig_mod`` left out), its name without ``:self`` /
``:cross`` (``decoder.attend``, ``layers.0.attn@2``; a tap's name), or its module's class
name (``AttentionRouter``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from torch import nn

from attnaudit.errors import CaptureError, CaptureOptionError
from attnaudit.record import Kind

KINDS = ("self", "cross")
Patterns = tuple[str, ...]
PatternsArg = str | Iterable[str] | None  # what a caller may give: one pattern or several


def _patterns(value: PatternsArg, what: str) -> Patterns:
    if value is None:
        return ()
    if not isinstance(value, Iterable) or isinstance(value, Mapping):
        raise TypeError(f"{what} must be a pattern (str) or a list of patterns; got {value!r}")
    items = (value,) if isinstance(value, str) else tuple(value)
    if not all(isinstance(p, str) for p in items):
        raise TypeError(f"{what} must be a pattern (str) or a list of patterns; got {value!r}")
    if not all(items):
        raise CaptureOptionError(f"{what}: an empty pattern matches no site; got {value!r}")
    return items


def _kinds(value: Mapping[str, str] | Iterable[tuple[str, str]] | None,
           what: str) -> tuple[tuple[str, Kind], ...]:
    if value is None:
        return ()
    if not isinstance(value, Iterable):
        raise TypeError(f"{what} must map patterns to 'self' or 'cross'; got {value!r}")
    pairs = tuple(value.items()) if isinstance(value, Mapping) else tuple(value)
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise TypeError(f"{what} must map patterns to 'self' or 'cross'; got {value!r}")
        if pair[1] not in KINDS:
            raise CaptureOptionError(f"{what}[{pair[0]!r}] must be 'self' or 'cross', got "
                               f"{pair[1]!r}; leave a site out with exclude=[...] instead")
    return pairs


def matches(pattern: str, names: Iterable[str]) -> bool:
    """True when ``pattern`` matches the whole of one of ``names``."""
    return any(fnmatchcase(name, pattern) for name in names)


@dataclass(frozen=True)
class SiteRules:
    """What one source of facts says about sites, by pattern (module docstring).

    attention: sites that are attention whatever a later source says. not_attention:
    sites that are never sites (beats ``attention`` and ``kinds``). kinds: ``(pattern,
    "self" | "cross")`` pairs, first match first; a site given a kind is attention.
    """

    attention: Patterns = ()
    not_attention: Patterns = ()
    kinds: tuple[tuple[str, Kind], ...] = ()

    @classmethod
    def of(cls, include: PatternsArg = None, exclude: PatternsArg = None,
           roles: Mapping[str, str] | None = None) -> SiteRules:
        """The rules of ``capture(include=..., exclude=..., roles=...)``, checked."""
        return cls(_patterns(include, "include"), _patterns(exclude, "exclude"),
                   _kinds(roles, "roles"))

    def __bool__(self) -> bool:
        return bool(self.attention or self.not_attention or self.kinds)

    def is_attention(self, names: Iterable[str]) -> bool | None:
        """True / False when these rules say whether a site named ``names`` (its path, site
        name and class name) is attention; None when they say nothing."""
        names = tuple(names)
        if any(matches(p, names) for p in self.not_attention):
            return False
        if any(matches(p, names) for p in self.attention) or self.kind(names) is not None:
            return True
        return None

    def kind(self, names: Iterable[str]) -> Kind | None:
        """The kind these rules give a site named ``names``, or None."""
        names = tuple(names)
        return next((kind for pattern, kind in self.kinds if matches(pattern, names)), None)


@dataclass(frozen=True)
class ModelFacts:
    """The facts of one architecture: one entry of the table.

    architecture: the key, a Hugging Face ``config.model_type`` or a model's class name.
    serves: which code the entry is for, and why it is needed (a note, required).
    attention / not_attention / kinds: :class:`SiteRules` patterns (routers, mixers and
    softmaxes over depth are ``not_attention``; attention under names no rule reads is
    ``attention``). sinks: names of locals or module attributes holding sink logits,
    beyond the generic ``sinks`` / ``sink`` / ``s_aux``. lead: positions of its own the
    model prepends to every sequence (keys before the sequence's in every attention call),
    an int or the name of a config attribute holding it. pad_id, whole_ids_per_step,
    prefix_context: how the model builds its input from the ids
    (:class:`attnaudit.targets.hf.own_input.OwnInput`).
    """

    architecture: str
    serves: str
    attention: PatternsArg = ()
    not_attention: PatternsArg = ()
    kinds: Mapping[str, Kind] | tuple[tuple[str, Kind], ...] = ()
    sinks: PatternsArg = ()
    lead: int | str = 0
    pad_id: int | None = None
    whole_ids_per_step: bool = False
    prefix_context: bool = False
    sites: SiteRules = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.architecture, str):
            raise TypeError(f"architecture must be a model_type or class name, got "
                            f"{self.architecture!r}")
        if not self.architecture.strip():
            raise CaptureOptionError(f"architecture must be a model_type or class name, got "
                                     f"{self.architecture!r}")
        if not isinstance(self.serves, str) or not self.serves.strip():
            raise CaptureOptionError(f"model facts for {self.architecture!r}: say which code the "
                               "entry serves (serves='...')")
        if not (isinstance(self.lead, str) or (type(self.lead) is int and self.lead >= 0)):
            raise CaptureOptionError(f"model facts for {self.architecture!r}: lead must be a "
                               f"non-negative int or a config attribute name, got {self.lead!r}")
        if self.pad_id is not None and (type(self.pad_id) is not int or self.pad_id < 0):
            raise CaptureOptionError(f"model facts for {self.architecture!r}: pad_id must be "
                                     f"None or a token id >= 0, got {self.pad_id!r}")
        for flag in ("whole_ids_per_step", "prefix_context"):
            if not isinstance(getattr(self, flag), bool):
                raise CaptureOptionError(f"model facts for {self.architecture!r}: {flag} must "
                                         f"be True or False, got {getattr(self, flag)!r}")
        # held as tuples whatever was given, so that entries compare and hash
        attention, not_attention = (_patterns(self.attention, "attention"),
                                    _patterns(self.not_attention, "not_attention"))
        kinds = _kinds(self.kinds, "kinds")
        object.__setattr__(self, "attention", attention)
        object.__setattr__(self, "not_attention", not_attention)
        object.__setattr__(self, "kinds", kinds)
        object.__setattr__(self, "sinks", _patterns(self.sinks, "sinks"))
        object.__setattr__(self, "sites", SiteRules(attention, not_attention, kinds))

    @property
    def sink_names(self) -> Patterns:
        """The names of locals or module attributes holding sink logits it adds."""
        return _patterns(self.sinks, "sinks")

    def lead_for(self, config: Any) -> int:
        """The leading positions of a model with ``config`` (``lead``, read off the config
        when it names an attribute)."""
        if isinstance(self.lead, int):
            return self.lead
        value = getattr(config, self.lead, None)
        if type(value) is not int or value < 0:
            raise CaptureOptionError(f"model facts for {self.architecture!r}: lead names "
                               f"config.{self.lead}, which the model's config does not hold "
                               f"as a non-negative int (got {value!r})")
        return value


BUILT_IN: tuple[ModelFacts, ...] = (
    ModelFacts(
        "cpmant",
        serves="transformers' CpmAntForCausalLM: its forward prepends config.prompt_length "
        "learned prompt positions to every sequence, reads id 0 as padding (not its dummy "
        "attention_mask), wants the whole sequence's ids in a cached step, and attends both "
        "ways in one pass where its generate() is a prefix LM "
        "(attnaudit.targets.hf.own_input)",
        lead="prompt_length", pad_id=0, whole_ids_per_step=True, prefix_context=True),
)

_BUILT_IN = {facts.architecture: facts for facts in BUILT_IN}
_REGISTERED: dict[str, ModelFacts] = {}


def register_model_facts(facts: ModelFacts, *, replace: bool = False) -> None:
    """Add ``facts`` to the table for every later capture and target of its architecture.

    An entry registered for an architecture with a built-in one replaces it (the built-in
    is back after :func:`unregister_model_facts`). Registering the same architecture twice
    raises :class:`CaptureError` unless ``replace=True``."""
    if not isinstance(facts, ModelFacts):
        raise TypeError(f"register_model_facts takes a ModelFacts, got {type(facts).__name__}")
    if facts.architecture in _REGISTERED and not replace:
        raise CaptureError(f"model facts for {facts.architecture!r} are already registered; "
                           "pass replace=True to replace them, or unregister_model_facts first")
    _REGISTERED[facts.architecture] = facts


def unregister_model_facts(architecture: str) -> ModelFacts:
    """Remove the registered entry for ``architecture`` (a built-in one is kept); return it."""
    if architecture not in _REGISTERED and architecture in _BUILT_IN:
        raise CaptureError(f"the model facts for {architecture!r} are built in and stay; "
                           "register_model_facts an entry for it to override them")
    if architecture not in _REGISTERED:
        raise CaptureError(f"no model facts registered for {architecture!r}; registered: "
                           f"{sorted(_REGISTERED)}")
    return _REGISTERED.pop(architecture)


def model_facts(architecture: str) -> ModelFacts | None:
    """The table's entry for ``architecture``: the registered one, else the built-in one."""
    return _REGISTERED.get(architecture, _BUILT_IN.get(architecture))


def architectures(modules: Iterable[nn.Module]) -> list[str]:
    """The keys a model is looked up by, model first: the class name of the first of
    ``modules`` (the model) and each distinct ``config.model_type`` among them."""
    keys: list[str] = []
    for i, module in enumerate(modules):
        if i == 0:
            keys.append(type(module).__name__)
        model_type = getattr(getattr(module, "config", None), "model_type", None)
        if isinstance(model_type, str) and model_type and model_type not in keys:
            keys.append(model_type)
    return keys


def facts_for(modules: Iterable[nn.Module]) -> list[ModelFacts]:
    """The table's entries for a model given as its ``modules`` (the model first)."""
    found = (model_facts(key) for key in architectures(modules))
    return [facts for facts in found if facts is not None]


@dataclass(frozen=True)
class Heuristic:
    """A generic rule that reads names (frame locals, function, module or file names).

    where: the code holding it (``module:symbol``). serves: the code it was written for.
    test: a test that fails without it (``path::function``)."""

    name: str
    where: str
    serves: str
    test: str


_CAPTURING = "tests/capturing/"
HEURISTICS: tuple[Heuristic, ...] = (
    Heuristic("role rules", "attnaudit.capturing.roles:ROLE_RULES",
              "routers, stream mixers and softmaxes over depth (each rule names its code)",
              _CAPTURING + "test_model_facts.py::test_every_role_rule_decides_its_own_example"),
    Heuristic("cross-attention words", "attnaudit.capturing.sites:CROSS_WORDS",
              "cross-attention module names of Hugging Face (encoder_attn, crossattention, "
              "EncDecAttention), fairseq, OpenNMT (context_attn), nn.TransformerDecoderLayer "
              "(multihead_attn) and research code (src_attn, enc_att, ...)",
              _CAPTURING + "test_site_identity.py::"
              "test_cross_attention_module_names_used_by_toolkits_are_cross"),
    Heuristic("self-attention word", "attnaudit.capturing.sites:kind_from_name",
              "self-attention modules whose last name part says self, as Hugging Face's "
              "BERT-style encoders name theirs (encoder.layer.0.attention.self)",
              _CAPTURING + "test_hf_path.py::test_bert_encoder_self_attention"),
    Heuristic("is_cross_attention local", "attnaudit.capturing.sites:CROSS_LOCAL",
              "Hugging Face attention forwards that compute is_cross_attention from their "
              "key_value_states (LED, LongT5, ProphetNet, SwitchTransformers)",
              _CAPTURING + "test_model_facts.py::test_the_is_cross_attention_local_gives_the_kind"),
    Heuristic("generation utilities", "attnaudit.capturing.sites:NOT_ATTENTION_DIRS",
              "softmaxes of transformers' sampling and logits processors (transformers/"
              "generation/), called from generate(), a method of the model",
              _CAPTURING + "test_model_facts.py::test_sampling_softmaxes_are_not_sites"),
    Heuristic("layout names", "attnaudit.capturing.layout:int_locals",
              "head counts, batch sizes and query lengths as fairseq (bsz, num_heads), "
              "OpenNMT (batch, tgt_len), LED and Hugging Face BART-style decoders name them "
              "in the frame that folds heads or steps into the batch",
              _CAPTURING + "test_model_facts.py::test_layout_names_at_the_call_site_unfold_heads"),
    Heuristic("module head count", "attnaudit.capturing.layout:module_heads",
              "attention modules that keep their head count as num_heads / n_heads / heads "
              "(research code, nn.MultiheadAttention)",
              _CAPTURING + "test_model_facts.py::test_a_module_head_count_unfolds_heads"),
    Heuristic("packed grouped-query step", "attnaudit.capturing.sdpa:_packed_gqa",
              "transformers/integrations/sdpa_attention.py's sdpa_attention_forward, which "
              "packs the query heads of each key/value head onto the query axis "
              "(pack_gqa) in a one-token step (its local q_length == 1)",
              _CAPTURING + "test_model_facts.py::test_a_packed_grouped_query_step_is_one_query"),
    Heuristic("sink names", "attnaudit.capturing.roles:SINK_NAMES",
              "GPT-OSS (module.sinks), Flint, Granite-SWA (s_aux): sink logits concatenated "
              "to the scores; the values' key count read from value_states / value / v",
              _CAPTURING + "test_sink_columns.py::"
              "test_a_sink_column_is_recorded_as_the_sink_not_as_a_key"),
)
