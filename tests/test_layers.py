"""The package's layering: every import of jaxvb points down, and none hides in a function.

Each module has a rank (its layer, below); a module may import a module of a lower
rank, or one of its own package. An import inside a function or class would dodge the
rule at import time, so jaxvb has none (``if TYPE_CHECKING:`` blocks, read by type
checkers only, excepted).
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "jaxvb"

#: Layers, lowest first; a module's rank is that of the longest prefix listed.
LAYERS = [
    # helpers that know nothing of the rest
    ("jaxvb._version", "jaxvb._platform", "jaxvb._special", "jaxvb._random"),
    ("jaxvb._gamma", "jaxvb._static", "jaxvb.data"),
    ("jaxvb.linalg",),
    ("jaxvb._algebra",),
    ("jaxvb.families",),
    # the verdict on a fit: read by the diagnostics, set by the engine
    ("jaxvb.core.status", "jaxvb.structure"),
    ("jaxvb.methods",),
    ("jaxvb.diagnostics",),
    ("jaxvb.core",),
    ("jaxvb.latent",),
    ("jaxvb.interop", "jaxvb.batch"),
    # streamed, resumable stores of many fits: fit_batched's chunks, io's families
    ("jaxvb.many",),
    # the public paths of modules that live elsewhere
    ("jaxvb.kernel", "jaxvb.numpyro", "jaxvb.io", "jaxvb.composite"),
    ("jaxvb",),
    # built on the public API, as a user's code is
    ("jaxvb.models",),
    ("jaxvb.baselines",),
    ("jaxvb.demo",),
    ("jaxvb.__main__",),
]
RANK = {prefix: rank for rank, layer in enumerate(LAYERS) for prefix in layer}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _rank(module: str) -> int:
    for cut in range(module.count(".") + 1, 0, -1):
        prefix = ".".join(module.split(".")[:cut])
        if prefix in RANK:
            return RANK[prefix]
    raise AssertionError(f"{module} has no layer in tests/test_layers.py: add it")


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _imports(tree: ast.Module):
    """``(node, target module, inside a function or class)`` for each jaxvb import."""
    hidden = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            hidden.update(id(n) for n in ast.walk(node) if n is not node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(("typing", id(n)) for n in ast.walk(node) if n is not node)
    for node in ast.walk(tree):
        if ("typing", id(node)) in hidden:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            base = node.module
            targets = [
                f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base
                for a in node.names
            ]
        else:
            continue
        for target in targets:
            if target == "jaxvb" or target.startswith("jaxvb."):
                yield node, target, id(node) in hidden


def _violations():
    upward, hidden = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for node, target, inside in _imports(ast.parse(path.read_text("utf-8"))):
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports {target}"
            if inside:
                hidden.append(where)
            same_package = _package(target) == _package(module) != "jaxvb"
            if not same_package and _rank(target) >= _rank(module) and target != module:
                upward.append(where)
    upward, hidden = sorted(set(upward)), sorted(set(hidden))
    return upward, hidden


def test_every_import_points_down_the_layers():
    upward, _ = _violations()
    assert not upward, "imports that reach up (or across) the layers:\n" + "\n".join(upward)


def test_no_import_hides_inside_a_function():
    _, hidden = _violations()
    assert not hidden, "imports inside functions or classes:\n" + "\n".join(hidden)


def test_no_module_is_longer_than_the_limit():
    """No module over about 600 lines: a longer one holds more than one idea."""
    limit = 650
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text("utf-8").splitlines())) > limit
    }
    assert not long, f"modules over {limit} lines: {long}"


def test_no_function_is_longer_than_the_limit():
    """No function body over about 80 lines (its docstring aside): a longer one does
    several things that deserve names."""
    limit = 85
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = node.body
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]  # the docstring
            if body and body[-1].end_lineno - body[0].lineno + 1 > limit:
                long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
    assert not long, f"functions over {limit} lines: {long}"
