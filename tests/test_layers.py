"""The package's layers: a module may import only from its own layer or the layers below it.

Every ``import`` of an lmforge module is checked, at the top of a file or inside a function alike (a lazy import
is still a dependency). The order, lowest first, is the README's ("Where things live"; a test holds them equal):
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import lmforge

SRC = Path(lmforge.__file__).parent

# Lowest first. A module belongs to the first entry that names it or one of its packages.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base: configs, errors, utilities, the model-folder format", ("errors", "choices", "config", "utils")),
    ("leaves: text, tokens, scores (torch-light)", ("data", "tokenizers", "metrics")),
    ("blocks", ("nn",)),
    ("checkpoint formats: Hugging Face key maps and configs", ("interop",)),
    ("models", ("models",)),
    ("heads", ("heads",)),
    ("objectives and tasks", ("objectives", "tasks")),
    # the deprecated lmforge.models.pretrained is a shim of this layer (it resolves names through the package root)
    ("persistence: any model folder, task-model rebuild, Hugging Face dispatch", ("persistence", "models.pretrained")),
    ("using models: decoding, embeddings, pictures, prompting", ("generation", "embeddings", "viz", "prompting")),
    ("training", ("training",)),
    ("recipes: what a user runs", ("recipes",)),
    ("pipelines", ("pipelines",)),
    ("serving", ("serve",)),
    # compare and demo at the root are shims kept for one release (the deprecated ``lmforge.compare``, the old
    # ``python -m lmforge.demo``): entry points for users, which nothing in the package may import
    ("command line", ("commands", "cli", "__main__", "compare", "demo")),
]

# Imports that go up today, each waiting for its part of the layering work; the test fails when one disappears
# too, so that this list only shrinks.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def layer_of(module: str) -> int:
    """The layer index of ``lmforge.<module>``; the package root (``__version__``, lazy ``pipeline``) is outside."""
    best, best_len = None, -1
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best_len:
                best, best_len = index, len(name)
    if best is None:
        raise AssertionError(f"lmforge.{module} is in no layer: add it to LAYERS in tests/test_layers.py")
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def lmforge_imports(path: Path) -> set[str]:
    """The lmforge modules ``path`` imports (``from lmforge.x import y`` names ``x.y`` when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lmforge":
            base = node.module.split(".", 1)[1] if "." in node.module else ""
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                is_module = (SRC / sub.replace(".", "/")).with_suffix(".py").is_file() or (SRC / sub.replace(
                    ".", "/")).is_dir()
                found.add(sub if is_module else base)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".", 1)[1] for a in node.names if a.name.startswith("lmforge."))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("lmforge.")
              and node.value.replace(".", "").replace("_", "").isalnum()):
            sub = node.value.split(".", 1)[1]  # a module named for importlib.import_module (lazy re-exports)
            if (SRC / sub.replace(".", "/")).with_suffix(".py").is_file():
                found.add(sub)
    return {m for m in found if m}  # "" is the package root: __version__ and the lazy pipeline


def upward_imports() -> set[tuple[str, str]]:
    found = set()
    for path in sorted(SRC.rglob("*.py")):
        importer = module_name(path)
        if not importer:
            continue  # the package root only re-exports lazily
        for imported in lmforge_imports(path):
            if layer_of(imported) > layer_of(importer):
                found.add((importer, imported))
    return found


def test_every_module_has_a_layer():
    for path in SRC.rglob("*.py"):
        if module_name(path):
            layer_of(module_name(path))


def test_no_import_goes_up_a_layer():
    found = upward_imports()
    new = sorted(found - KNOWN_UPWARD)
    assert not new, "imports that go up the layers (see LAYERS): " + "; ".join(
        f"lmforge.{a} ({LAYERS[layer_of(a)][0]}) imports lmforge.{b} ({LAYERS[layer_of(b)][0]})" for a, b in new)
    gone = sorted(KNOWN_UPWARD - found)
    assert not gone, f"fixed, so remove from KNOWN_UPWARD: {gone}"


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    """The check can fail: a lazy import from a function body of a low layer is found."""
    fake = tmp_path / "lmforge"
    (fake / "nn").mkdir(parents=True)
    (fake / "training").mkdir()
    (fake / "nn" / "__init__.py").write_text("")
    (fake / "training" / "__init__.py").write_text("")
    (fake / "training" / "trainer.py").write_text("")
    (fake / "nn" / "blocks.py").write_text("def f():\n    from lmforge.training.trainer import Trainer\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", fake)
    assert upward_imports() == {("nn.blocks", "training.trainer")}


def package_of(module: str) -> str:
    return module.split(".")[0]


def package_cycles() -> list[list[str]]:
    """Import circles among the top-level packages (``models`` -> ``heads`` -> ``models``), found by depth-first
    search over the graph of package-to-package imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        importer = module_name(path)
        if not importer:
            continue
        for imported in lmforge_imports(path):
            a, b = package_of(importer), package_of(imported)
            if a != b:
                graph.setdefault(a, set()).add(b)
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_no_import_circle_among_packages():
    assert package_cycles() == []


def test_the_circle_check_sees_a_circle(tmp_path, monkeypatch):
    fake = tmp_path / "lmforge"
    for package, body in (("models", "from lmforge.heads import base\n"), ("heads", "from lmforge.models import x\n")):
        (fake / package).mkdir(parents=True)
        (fake / package / "__init__.py").write_text("")
        (fake / package / "base.py").write_text(body)
        (fake / package / "x.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "SRC", fake)
    assert package_cycles() == [["heads", "models", "heads"]]


def test_the_readme_states_the_same_order():
    """The README's layer diagram (top first) names every layer's packages in the order of LAYERS (lowest first)."""
    readme = (SRC.parents[1] / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Where things live", 1)[1].split("```", 2)[1].splitlines()
    row_of = {}
    for row, line in enumerate(block):
        for word in line.replace(",", " ").replace("(", " ").split():
            name = word.rstrip("/").removesuffix(".py")
            if word.endswith(("/", ".py")) and "/" not in name:
                row_of.setdefault(name, row)
    rows = []
    for title, names in LAYERS:
        shown = [row_of[n] for n in names if n in row_of]
        assert shown, f"the README's diagram does not name layer {title!r} ({', '.join(names)})"
        rows.append(min(shown))
    assert rows == sorted(rows, reverse=True), "the README lists the layers in another order than LAYERS"
