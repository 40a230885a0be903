"""Every exception attnaudit defines; each says what was looked for and what to do instead.

The hierarchy::

    Exception
    ├── AttnauditError                 raised on purpose: the CLI prints it as one line, exit 2
    │                                  (any other exception reaching the CLI is a bug: exit 4)
    │   ├── CaptureError (RuntimeError)       capture cannot start or proceed
    │   │   ├── NoAttentionFound              the model ran, no attention site was seen
    │   │   ├── SiteNotFound (KeyError)       requested sites never appeared
    │   │   └── CaptureOptionError (ValueError)   a capture option has an unusable value
    │   ├── EditError (ValueError)            an edit returned something unusable
    │   ├── TargetError                       a target cannot be loaded or lacks a part
    │   │   └── OptionError (ValueError)      an audit setting has an unusable value
    │   ├── DataFileError                     a data file is not source[<TAB>target] lines
    │   ├── AlignmentError (ValueError)       a word-alignment file or request is unusable
    │   ├── AnalysisError (ValueError)        an analyser cannot use its input (shapes, spans)
    │   ├── TokenizerError                    a checkpoint's tokenizer is missing or useless
    │   ├── InterventionError (ValueError)    an intervention or attribution cannot run
    │   ├── OutputFolderError                 an output location cannot take the output
    │   ├── RankError                         an AttnauditError on one rank, on every rank
    │   ├── CollectiveError                   a collective failed (a peer died or timed out)
    │   ├── GateError                         the gate was asked for what it cannot do
    │   ├── AuditError                        an audit cannot give the view asked for
    │   ├── ExplorerError (ValueError)        the attention explorer cannot show its input
    │   ├── ReportError (ValueError)          a table or figure of a report cannot be made
    │   └── ContributionError (ValueError)    a contribution measure cannot be computed
    ├── RankFailed (RuntimeError)      an unexpected error on one rank, raised on every rank:
    │                                  a bug, not a refusal, so it keeps its traceback (exit 4)
    └── KeyboardInterrupt
        └── Terminated                 SIGTERM in the CLI, raised like Ctrl-C so that every
                                       ``finally`` and output folder cleans up
"""

from __future__ import annotations


class AttnauditError(Exception):
    """Base class of every error attnaudit raises on purpose."""


class CaptureError(AttnauditError, RuntimeError):
    """Capture cannot start or cannot proceed (nested capture, unsupported backend...)."""


class NoAttentionFound(CaptureError):
    """The model ran inside a capture but no attention site was seen."""


class SiteNotFound(CaptureError, KeyError):
    """Requested site names never appeared while capturing."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


class CaptureOptionError(CaptureError, ValueError):
    """A capture option (``kinds``, ``roles``, ``heads``, ``max_memory``, a tap's ``kind`` or
    key mask, a model-facts entry) has a value capture cannot use; the message names it."""


class EditError(AttnauditError, ValueError):
    """An edit callable returned something the model cannot use in place of its weights."""


class TargetError(AttnauditError):
    """A target could not be loaded or does not provide what the audit needs."""


class OptionError(TargetError, ValueError):
    """An audit setting (:mod:`attnaudit.options`, a keyword of :func:`attnaudit.audit`, a
    flag) has a value it cannot take; the message names the setting and what it takes.
    A TargetError and a ValueError, as the checks it replaces raised."""


class DataFileError(AttnauditError):
    """A data file cannot be read as ``source[<TAB>target]`` lines."""


class AlignmentError(AttnauditError, ValueError):
    """A Pharaoh alignment file cannot be read, does not match the data, or an alignment was
    asked of a measure, layer or convention that does not exist."""


class AnalysisError(AttnauditError, ValueError):
    """An analyser, or a helper that builds its input (expectations, spans, gold links,
    word groups), was given what it cannot use; the message names the site and the part."""


class TokenizerError(AttnauditError):
    """A checkpoint's tokenizer is missing or turns the audit data into nothing."""


class InterventionError(AttnauditError, ValueError):
    """An intervention or an attribution cannot run on this target or input (no selectable
    sites, wrong shapes, an unknown method or baseline...)."""


class OutputFolderError(AttnauditError):
    """The output location cannot take the output (names a file, unwritable, not ours)."""


class RankError(AttnauditError):
    """An attnaudit error on one rank of a distributed audit, raised on every rank."""


class CollectiveError(AttnauditError):
    """A collective failed: a peer rank died, or did not arrive within the timeout."""


class GateError(AttnauditError):
    """The gate was asked for something it cannot do (bad option value, unwritable file)."""


class AuditError(AttnauditError):
    """An audit cannot give the view asked for (a loaded audit has no live parts)."""


class ExplorerError(AttnauditError, ValueError):
    """The attention explorer was given what it cannot show: no attention, an example out
    of range, token labels or a measure that do not fit the maps."""


class ReportError(AttnauditError, ValueError):
    """A table or figure of a report cannot be made of what it was given (two tables on
    one file name, weights of the wrong shape)."""


class ContributionError(AttnauditError, ValueError):
    """A contribution measure cannot be computed for a target (no values, no output
    projection, no decomposable block); the message names the sites and why."""


class RankFailed(RuntimeError):
    """An unexpected error on one rank of a distributed audit, raised on every rank."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every ``finally`` and output folder cleans up."""
