"""A cache for the index and mask tables that models compute from sizes alone (window indices, masks)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def cached_size_table(maxsize: int) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """``functools.lru_cache(maxsize)`` (``maxsize`` the entries kept) for a function of hashable sizes (ints, tuples,
    devices) returning tensors; code being compiled calls the function itself, which ``torch.compile`` traces into its
    graph (it would skip the cache anyway, with a warning at every such call)."""

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        cached = functools.lru_cache(maxsize=maxsize)(fn)

        @functools.wraps(fn)
        def table(*args) -> T:
            return fn(*args) if torch.compiler.is_compiling() else cached(*args)

        return table

    return decorate
