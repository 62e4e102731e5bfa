"""One base for the mistakes a user can make and fix: `UserError`.

The CLI prints any `UserError` as one line (`draftless: error: ...`, exit 2) and the server
answers it with a 4xx and a JSON error body; anything else is a bug and keeps its traceback.
Each module raises its own subclass, so a caller can still catch a narrow kind.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake in what the user asked for; the message is one line meant for them."""


class UsageError(UserError, ValueError):
    """A bad command-line argument or request field."""
