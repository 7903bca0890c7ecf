"""The package's shape, checked from its own imports (docs/ARCHITECTURE.md, "Layers").

The import graph is read with ``ast`` from every module: module-level and function-local
imports alike (``TYPE_CHECKING`` blocks left out, since they never run), as the house's
before-stop hook reads it. No module may reach itself through it, each layer imports only the
layers below it, and every dotted path a user writes (in ``TASKS``, ``LOGGING``, ``JOBQ``, the
URLconf, and the imports in the README and docs) keeps working after a module moved.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "django_jobq"

#: Cycles allowed inside one package, each with its reason in docs/ARCHITECTURE.md: none.
ALLOWED_CYCLES: list[set[str]] = []

#: What each layer may import, by module-name prefix (docs/ARCHITECTURE.md, "Layers"). A
#: module not named here is checked by the no-cycle rule only.
VALUES = ("errors", "states", "validation", "serde", "job")
PLUMBING = (*VALUES, "conf", "signals")
RULES = {
    # plumbing: nothing above it
    **{name: PLUMBING for name in PLUMBING},
    "models": (*VALUES, "models"),
    # storage: the value objects, the models (the database backend's state) and storage
    # itself; never the settings, the registry, the Queue API or the task layer
    "storage": (*VALUES, "models", "storage"),
    # the registry and the retry policies: what runs each job, read by the storage builder
    "tasks.registry": (*PLUMBING, "tasks.policy"),
    "tasks.policy": PLUMBING,
    "backend": (*PLUMBING, "storage", "tasks.registry"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for p in PKG.rglob("*.py")
        if "migrations" not in p.parts and "__pycache__" not in p.parts
    }


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports: a ``from a.b import c`` names module ``a.b.c``
    when it is one, else ``a.b`` (the deepest known module on the path)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()

    def resolve(dotted: str) -> str:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for branch in child.orelse:
                    visit(branch)
                continue
            if isinstance(child, ast.Import):
                found.update(resolve(a.name) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package[: len(package) - child.level + 1]
                    base = ".".join([*parts, *([base] if base else [])])
                found.update(resolve(f"{base}.{a.name}") for a in child.names)
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard("")
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph = {name: imports_of(name, path, set(known)) for name, path in known.items()}
    # The root package re-exports the public API (lazily): it is the top, not a layer.
    graph["django_jobq"] = set()
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def short(name: str) -> str:
    return name.removeprefix("django_jobq.")


def test_no_module_imports_itself_through_others():
    found = [{short(m) for m in c} for c in cycles(import_graph())]
    assert [c for c in found if c not in ALLOWED_CYCLES] == []


def test_the_cycle_check_sees_function_local_imports(tmp_path):
    """The check must fail on a cycle closed by an import inside a function (the kind that
    grew the 32-module cycle), not only on module-level ones."""
    graph = {
        "a": imports_of("a", _module(tmp_path, "a", "import b\n"), {"a", "b"}),
        "b": imports_of("b", _module(tmp_path, "b", "def f():\n    import a\n"), {"a", "b"}),
    }
    assert cycles(graph) == [{"a", "b"}]
    hidden = _module(tmp_path, "c", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                    "    import a\n")  # fmt: skip
    assert imports_of("c", hidden, {"a", "c"}) == set()


def _module(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path


@pytest.mark.parametrize("layer", sorted(RULES))
def test_each_layer_imports_only_what_is_below_it(layer):
    allowed = tuple(f"django_jobq.{p}" for p in RULES[layer])
    bad = {}
    for name, targets in import_graph().items():
        if short(name) != layer and not short(name).startswith(layer + "."):
            continue
        wrong = sorted(
            short(t) for t in targets
            if t.startswith("django_jobq.") and not any(
                t == a or t.startswith(a + ".") for a in allowed
            )
        )  # fmt: skip
        if wrong:
            bad[short(name)] = wrong
    assert bad == {}


def test_the_top_of_the_package_reads_at_a_glance():
    """At most 25 names at the top of ``django_jobq/`` (one folder per concept); the folders
    whose names and places Django fixes (migrations, static, templates, templatetags) aside."""
    names = [
        p.name for p in PKG.iterdir()
        if not p.name.startswith(("_", "."))
        and p.name not in ("migrations", "static", "templates", "templatetags", "py.typed")
    ]  # fmt: skip
    assert len(names) <= 25, sorted(names)


# -- paths users write -------------------------------------------------------------------------

#: Module paths the docs gave before the package was restructured, with the module
#: now behind each: the same module object, not a copy.
OLD_MODULES = {
    "django_jobq.celery_compat": "django_jobq.contrib.celery",
    "django_jobq.celery_compat.bridge": "django_jobq.contrib.celery.bridge",
    "django_jobq.flows": "django_jobq.queue.flows",
    "django_jobq.logjson": "django_jobq.observability.logs",
    "django_jobq.metrics": "django_jobq.observability.metrics",
    "django_jobq.metrics.urls": "django_jobq.observability.metrics.urls",
    "django_jobq.spark": "django_jobq.contrib.spark",
    "django_jobq.spark.enqueue": "django_jobq.contrib.spark.enqueue",
    "django_jobq.tasks_backend": "django_jobq.contrib.tasks_backend",
    "django_jobq.tracing": "django_jobq.observability.tracing",
}

#: ``from <module> import <name>`` as the docs showed it before the move, and where it is.
OLD_NAMES = {
    ("django_jobq.conf", "get_storage"): "django_jobq.backend",
    ("django_jobq.queue", "Queue"): "django_jobq.queue.core",
    ("django_jobq.queue", "get_queue"): "django_jobq.queue.core",
    ("django_jobq.broadcast", "Broadcast"): "django_jobq.broadcast.core",
    ("django_jobq.broadcast", "subscriber"): "django_jobq.broadcast.core",
    ("django_jobq.schedules", "validate_schedule"): "django_jobq.schedules.core",
    ("django_jobq.models", "Schedule"): "django_jobq.models.schedules",
    ("django_jobq.flows", "chain"): "django_jobq.queue.flows",
    ("django_jobq.flows", "enqueue_flow"): "django_jobq.queue.flows",
    ("django_jobq.tasks", "chord"): "django_jobq.tasks.canvas",
    ("django_jobq.tasks", "CanvasFailed"): "django_jobq.tasks.results",
    ("django_jobq.tasks_backend", "JobQBackend"): "django_jobq.contrib.tasks_backend",
    ("django_jobq.tasks_backend", "run_task"): "django_jobq.contrib.tasks_backend",
    ("django_jobq.celery_compat", "celery_task"): "django_jobq.contrib.celery",
    ("django_jobq.celery_compat", "publish"): "django_jobq.contrib.celery",
    ("django_jobq.logjson", "JsonFormatter"): "django_jobq.observability.logs",
    ("django_jobq.tracing", "use_provider"): "django_jobq.observability.tracing",
    ("django_jobq.storage.redis.cluster_cache", "ClusterConnectionFactory"):
        "django_jobq.storage.redis.cluster_cache",
}  # fmt: skip


@pytest.mark.parametrize(("old", "new"), sorted(OLD_MODULES.items()))
def test_an_old_module_path_is_the_module_that_moved(old, new):
    module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    # It keeps its own spec: a relative import inside it resolves without a warning.
    assert (module.__name__, module.__spec__.name) == (new, new)
    assert module.__spec__.parent == module.__package__


@pytest.mark.parametrize(("where", "new"), sorted(OLD_NAMES.items()))
def test_an_old_import_gives_the_object_that_moved(where, new):
    module, name = where
    assert getattr(importlib.import_module(module), name) is getattr(
        importlib.import_module(new), name
    )


def test_the_old_tasks_backend_path_builds_the_backend():
    """``TASKS = {"default": {"BACKEND": "django_jobq.tasks_backend.JobQBackend"}}`` as the
    docs wrote it before the move: Django's handler builds our backend from it."""
    from django.tasks import task_backends
    from django.test import override_settings

    from django_jobq.contrib.tasks_backend import JobQBackend

    old = {"old": {"BACKEND": "django_jobq.tasks_backend.JobQBackend", "QUEUES": ["default"]}}
    with override_settings(TASKS=old):
        assert isinstance(task_backends["old"], JobQBackend)


def test_the_old_log_formatter_path_configures_logging():
    import logging.config

    from django_jobq.observability.logs import JsonFormatter

    logging.config.dictConfig({
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"json": {"()": "django_jobq.logjson.JsonFormatter"}},
        "handlers": {"probe": {"class": "logging.NullHandler", "formatter": "json"}},
        "loggers": {"django_jobq.layers-probe": {"handlers": ["probe"]}},
    })  # fmt: skip
    handler = logging.getLogger("django_jobq.layers-probe").handlers[0]
    assert type(handler.formatter) is JsonFormatter


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"```(?:python|py)?\n(.*?)```", re.S)
_FROM = re.compile(r"^\s*from (django_jobq[\w.]*) import \(?([\w, ]+)", re.M)
_DOTTED = re.compile(r"""["'](django_jobq(?:\.\w+)+)["']""")


def documented_imports() -> list[tuple[str, str, str]]:
    """(doc, module, name) of every ``from django_jobq... import`` in the docs' code blocks."""
    found = []
    for doc in DOCS:
        for block in _FENCE.findall(doc.read_text()):
            for module, names in _FROM.findall(block):
                for name in (n.strip() for n in names.split(",")):
                    if name:
                        found.append((doc.name, module, name))
    return found


def documented_paths() -> list[tuple[str, str]]:
    """(doc, path) of every quoted dotted path to code in the docs' code blocks (``BACKEND``,
    ``include()``, a ``LOGGING`` factory); logger names are paths to modules too."""
    return [
        (doc.name, path)
        for doc in DOCS
        for block in _FENCE.findall(doc.read_text())
        for path in _DOTTED.findall(block)
    ]


@pytest.mark.parametrize(("doc", "module", "name"), documented_imports())
def test_every_import_the_docs_show_works(doc, module, name):
    if module.endswith(("spark",)) or ".spark" in module:
        pytest.importorskip("pyspark")
    assert hasattr(importlib.import_module(module), name), f"{doc}: from {module} import {name}"


@pytest.mark.parametrize(("doc", "path"), documented_paths())
def test_every_dotted_path_the_docs_show_resolves(doc, path):
    from django.utils.module_loading import import_string

    try:
        importlib.import_module(path)
    except ImportError:
        assert import_string(path) is not None, f"{doc}: {path}"
