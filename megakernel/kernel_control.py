"""The kernel's control flow: ``pl.when``, ``lax.fori_loop`` and ``lax.cond``, each body its own
cache region (:meth:`megakernel.kernel_refs.KernelRefs.region`: a value traced inside a branch
or a loop body is not reused outside it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.experimental import pallas as pl

from megakernel.kernel_refs import KernelRefs


class ControlFlow(KernelRefs):
    """Control-flow wrappers over the refs (Python booleans run statically)."""

    def when(self, cond: Any, fn: Callable[[], None]) -> None:
        """``pl.when`` whose body is its own cache region (Python booleans run statically)."""
        if isinstance(cond, bool):
            if cond:
                fn()
            return

        def body() -> None:
            with self.region():
                fn()

        pl.when(cond)(body)

    def fori(self, lower: Any, upper: Any, body: Callable[[Any, Any], Any], init: Any) -> Any:
        """``lax.fori_loop`` whose body is its own cache region."""
        def wrapped(i: Any, carry: Any) -> Any:
            with self.region():
                return body(i, carry)

        return jax.lax.fori_loop(lower, upper, wrapped, init)

    def cond(self, pred: Any, true_fn: Callable[[], None], false_fn: Callable[[], None]) -> None:
        """``lax.cond`` over two side-effecting branches, each its own cache region."""
        def wrap(fn: Callable[[], None], name: str) -> Callable[[], None]:
            def branch() -> None:
                outer, self.branch = self.branch, name
                with self.region():
                    fn()
                self.branch = outer
            return branch

        jax.lax.cond(pred, wrap(true_fn, "true"), wrap(false_fn, "false"))
