"""Fast constructors of the frozen value objects the Redis backend decodes in bulk.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` looked up
per field; for ``JobRecord`` (27 fields) that was most of the cost of decoding a record, and
the model mirror decodes tens of thousands a second (records and stream entries). The
builders made here set the slots through their descriptors instead: the same object as
``cls(*values)`` (tests/test_redis_builders.py compares them), in about a third of the time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


def positional_builder[T](cls: type[T]) -> Callable[..., T]:
    """A function taking every field of ``cls`` in order (no defaults) and returning the
    instance. Only for frozen, slotted dataclasses without ``__post_init__``: anything else
    would be built differently than its constructor builds it, so it is refused."""
    params = getattr(cls, "__dataclass_params__", None)
    if (params is None or not params.frozen or "__slots__" not in cls.__dict__
            or hasattr(cls, "__post_init__")):  # fmt: skip
        raise TypeError(f"{cls.__name__} is not a frozen, slotted dataclass without hooks")
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    scope.update({f"_set_{n}": getattr(cls, n).__set__ for n in names})
    body = "".join(f"    _set_{n}(o, {n})\n" for n in names)
    source = f"def build({', '.join(names)}):\n    o = _new(_cls)\n{body}    return o\n"
    exec(source, scope)  # noqa: S102 - the source is made of the class's own field names
    return scope["build"]
