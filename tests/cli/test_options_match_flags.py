"""The flags and :class:`attnaudit.options.AuditOptions` are one list of settings: each flag
that sets an audit setting has the setting's name and default, every setting but the mode
has a flag, a flag means one thing on every command, and ``attnaudit.audit``'s keywords are
the same names."""

from __future__ import annotations

import argparse
import inspect
from dataclasses import fields

import pytest

import attnaudit
from attnaudit.cli.parser import build_parser
from attnaudit.cli.settings import audit_options
from attnaudit.errors import OptionError
from attnaudit.options import (
    AttributionSettings,
    AuditMode,
    AuditOptions,
    Edits,
    Loading,
    Tolerances,
    flag_of,
    setting_names,
)

# The flags that set no audit setting: what to audit, where output goes, how to print, and
# align's own choices. --quick is the mode (AuditMode.QUICK); --dry-run prints the plan
# (attnaudit.plan) in place of the audit.
COMMAND_FLAGS = {"help", "version", "debug", "quiet", "command", "target", "hf", "data",
                 "contrast", "out", "force", "json", "junit", "measure", "layer",
                 "convention", "units", "quick", "dry_run"}
PYTHON_ONLY = {"mode", "interventions"}  # check and --quick set the mode; the CLI always
# runs the suite that report and intervene are for


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _defaults() -> dict[str, object]:
    defaults: dict[str, object] = {}
    for group in (AuditOptions(), Edits(), AttributionSettings(), Tolerances(), Loading()):
        defaults |= {f.name: getattr(group, f.name) for f in fields(group)}
    return defaults


def test_every_setting_flag_is_named_and_defaulted_as_its_field():
    defaults, seen = _defaults(), set()
    for command, parser in _commands().items():
        for action in parser._actions:
            if action.dest in COMMAND_FLAGS:
                continue
            assert action.dest in setting_names(), (command, action.option_strings)
            assert action.option_strings == [flag_of(action.dest)], (command, action.dest)
            assert action.default == defaults[action.dest], (command, action.dest)
            seen.add(action.dest)
    assert seen == set(setting_names()) - PYTHON_ONLY


def test_a_flag_means_one_thing_on_every_command():
    meaning: dict[str, tuple] = {}
    for command, parser in _commands().items():
        for action in parser._actions:
            what = (action.dest, type(action).__name__,
                    getattr(action.type, "__qualname__", action.type), action.choices,
                    action.default, action.nargs)
            for flag in action.option_strings:
                assert meaning.setdefault(flag, what) == what, (command, flag)
    assert meaning["--out"][0] == "out"  # align's --out takes a folder too (test_align_out)


def test_parsed_flags_become_the_options_python_builds():
    args = build_parser().parse_args([
        "report", "--out", "o", "--quick", "--limit", "3", "--site", "a", "--site", "b",
        "--head", "1", "--sequence-effects", "--explorer-examples", "2", "--attribute",
        "entropy", "--attribution-variant", "inseq", "--methods", "deeplift,saliency",
        "--max-memory", "2GiB", "--batch-size", "4", "--num-beams", "2"])
    assert audit_options(args) == AuditOptions(
        mode=AuditMode.QUICK, limit=3, max_memory=2 << 30, explorer_examples=2,
        edits=Edits(sites=("a", "b"), heads=(1,), sequence_effects=True),
        attribution=AttributionSettings("entropy", "inseq", methods=("deeplift", "saliency")))
    # the loading flags made the target already (load_cli_target): an audit of a ready
    # target refuses them
    assert Loading(batch_size=args.batch_size, num_beams=args.num_beams).given() == {
        "batch_size": 4, "generation": {"num_beams": 2}}
    plain = build_parser().parse_args(["report", "--out", "o"])
    assert audit_options(plain) == AuditOptions()
    check = build_parser().parse_args(["check", "--max-masked-mass", "0.01"])
    assert audit_options(check, AuditMode.CHECKS) == AuditOptions(
        mode=AuditMode.CHECKS, tolerances=Tolerances(max_masked_mass=0.01))


def test_a_bad_value_names_the_flag_on_the_command_line_and_the_field_in_python():
    args = build_parser().parse_args(["check", "--row-sum-tolerance", "-1"])
    with pytest.raises(OptionError, match=r"^--row-sum-tolerance must be a finite number"):
        audit_options(args, AuditMode.CHECKS)
    with pytest.raises(OptionError, match=r"^row_sum_tolerance must be a finite number"):
        Tolerances(row_sum_tolerance=-1.0)


def test_the_audit_keywords_are_the_settings_names():
    own = {"target_or_model", "data", "tokenizer", "options", "progress", "command_line",
           "process_group", "hf_options", "quick", "checks_only"}  # the two modes as flags
    groups = {"edits", "tolerances", "loading"}
    for function in (attnaudit.audit, attnaudit.intervene):
        keywords = set(inspect.signature(function).parameters) - own
        assert keywords <= set(setting_names()) | {"attribution"}, function.__name__
    audit_keywords = set(inspect.signature(attnaudit.audit).parameters) - own
    loading = {f.name for f in fields(Loading)}  # from_hf's, through **hf_options
    assert audit_keywords | groups | loading | {"mode"} == \
        {f.name for f in fields(AuditOptions)} | set(setting_names()) - \
        {f.name for f in fields(AttributionSettings)}


def test_the_reproducing_command_line_keeps_the_edited_sites_and_heads():
    from attnaudit.cli.commands import report_command_line

    args = build_parser().parse_args(["report", "--out", "o", "--site", "attend:cross",
                                      "--head", "2", "--head", "0"])
    line = report_command_line(args)
    assert line[line.index("--site"):line.index("--site") + 6] == [
        "--site", "attend:cross", "--head", "2", "--head", "0"]
    again = build_parser().parse_args(line[1:])
    assert vars(again) == vars(args)
