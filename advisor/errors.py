"""The errors advisor raises for its user, each with a sentence that says what is wrong and what to do.

The command line turns an `InputError` into a usage error (exit code 2, naming the option), a `RulesError`
(a rules file that is bad input) into one sentence with exit code 2, and any other `Error` into one sentence
with exit code 1; the Python API raises them as they are."""

from __future__ import annotations


class Error(Exception):
    """Every error advisor raises for its user."""


class InputError(Error, ValueError):
    """A bad value of one option or argument: a usage error. `field` names it as the request dataclass does
    ('gpu', 'batch_size'), if one; the command line alone says it as its flag (advisor/cli/params.py)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class KBError(Error):
    """A knowledge base that cannot be used."""


class RulesError(Error):
    """A rules file that is missing a key or contradicts another."""


class ModelNotResolved(Error, ValueError):
    """A --model whose config cannot be found, or whose family cannot be told, without the network."""


class UnsupportedModel(ModelNotResolved):
    """A model advisor recognizes and cannot answer for (an encoder-decoder): no --arch would make it fit."""


class NoEvidence(Error):
    """No evidence group holds runs for the question asked."""


class FitError(Error):
    """A question `advisor fit` cannot answer: a model it cannot build or trace."""
