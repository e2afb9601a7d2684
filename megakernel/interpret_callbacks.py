"""Interpret-mode workaround: let the multi-device TPU interpreter allocate large buffers.

The Pallas TPU interpreter runs every memory operation as an ``io_callback``, and JAX's
``io_callback`` implementation (``jax._src.callback.io_callback_impl``) first moves the
callback's arguments to CPU device 0 (``device_put``). Under ``shard_map`` on N virtual CPU
devices every device sits inside such a callback at once; moving a large argument (the
initial value of a buffer of 128 KiB or more, measured on a 2-core host) from device ``k``
to device 0 then waits for device 0, which waits in its own callback: the interpreter
hangs in ``_allocate_buffer`` (``megakernel.multi_device_decode`` keeps its operands under
48 KiB for this reason). On CPU devices the arguments are host memory already, so
:func:`read_callback_args_in_place` makes the callback read them where they are.

Only for checkers that run the interpreter (never imported by the kernel); it patches JAX's
private module, so it is checked against the JAX version it was written for (0.10).
"""

from __future__ import annotations

from typing import Any

import numpy as np

PATCHED_FOR = "0.10."


def read_callback_args_in_place() -> None:
    """Replace ``io_callback``'s implementation with one that passes its arguments as numpy
    arrays without the move to device 0 (idempotent)."""
    import jax
    from jax._src import callback, tree_util

    if not jax.__version__.startswith(PATCHED_FOR):
        raise RuntimeError(f"megakernel.interpret_callbacks is written for JAX {PATCHED_FOR}x, not {jax.__version__}")

    def impl(*args: Any, result_avals: Any, callback: Any, sharding: Any, ordered: Any) -> Any:
        del result_avals, sharding, ordered
        return tree_util.tree_map(np.asarray, callback(*[np.asarray(a) for a in args]))

    callback.io_callback_impl = impl  # _callback looks it up by name at call time
