"""The one error type every user-facing input problem raises.

The CLI prints ``str(error)`` as a single line and exits non-zero; the message names the
file (or option) and the field that is wrong.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: an unknown name, an invalid file, an out-of-range option."""
