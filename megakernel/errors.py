"""The kernel's refusal: a schedule it cannot realise (raised by the DMA plan and the ring pools)."""

from __future__ import annotations


class UnsupportedSchedule(ValueError):
    """The kernel cannot realise this schedule (the message says which rule it breaks)."""
