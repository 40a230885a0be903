"""Errors raised by attnaudit; each says what was looked for and what to do instead."""

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


class EditError(AttnauditError, ValueError):
    """An edit callable returned something the model cannot use in place of its weights."""
