"""In-process storage: the same contract as Redis, for single-process apps and fast unit tests.

One lock guards everything, so each method is trivially one atomic step. Heaps use lazy
deletion: a cancelled or re-indexed job leaves a stale entry that is skipped when popped, which
keeps cancel O(log n) without a sorted-set implementation. Entries carry a version drawn from one
counter for the whole storage, so a stale entry can never match a later record of the same id
(a singleton successor, or an id used again after its record expired).

Package layout as in ``storage/database`` (same module names for the same operations, to read
side by side), each a class layered on the one before: ``core`` (``MemoryCore``, ``_step``) →
``events`` → ``failures`` → ``enqueue`` → ``claim`` → ``operations`` → ``retention`` → here.
"""

from .retention import Retaining


class MemoryStorage(Retaining):
    """The in-memory backend: every transition is inherited from the modules of this package."""

    supports_multiprocess = False
