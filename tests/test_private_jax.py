"""Private JAX lives in one module, jaxcoll/_jax.py: no other module of the package (jaxcoll/, lowering included) or
of the programs beside it (examples/, benchmarks/, tools/) imports `jax._src` or jaxlib's private modules, or
reaches for JAX's private attributes. Nor do they use `jax.interpreters` or `jax.core`: JAX's API compatibility
policy counts them legacy modules of private APIs, scheduled for deprecation (jax.extend has what is public of
them). In _jax.py each use says which public API it stands in for."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ALLOWED = REPO / "jaxcoll" / "_jax.py"
PRIVATE_MODULES = ("jax._src", "jaxlib.xla_client", "jaxlib._jax", "jaxlib.xla_extension", "jaxlib.mlir._mlir_libs",
                   "jax.interpreters", "jax.core")
# The legacy modules reached as attributes of jax (jax.core.ShapedArray after an `import jax`).
LEGACY_MODULES = {"core", "interpreters"}
# Private names that reach JAX internals through an attribute rather than an import.
PRIVATE_ATTRIBUTES = {"_src", "_check_vma", "_build_axis_index_lowering_hlo", "_xla", "_custom_type_id_handler",
                      "_const", "_lowerings", "_platform_specific_lowerings", "_uncacheable_primitives"}


def sources() -> list[Path]:
    # The top-level lowering/ is a link to jaxcoll/lowering/: its files are scanned once, under jaxcoll/.
    files = [p for folder in ("jaxcoll", "examples", "benchmarks", "tools") for p in (REPO / folder).rglob("*.py")]
    return sorted(files)


def private_uses(path: Path) -> list[str]:
    uses = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            if name.startswith(PRIVATE_MODULES):
                uses.append(f"line {node.lineno}: import {name}")
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES:
            uses.append(f"line {node.lineno}: .{node.attr}")
        if isinstance(node, ast.Attribute) and node.attr in LEGACY_MODULES and isinstance(node.value, ast.Name) \
                and node.value.id == "jax":
            uses.append(f"line {node.lineno}: jax.{node.attr}")
    return uses


def test_the_scan_sees_the_package_and_the_private_module():
    files = sources()
    assert ALLOWED in files and REPO / "jaxcoll" / "lowering" / "groups.py" in files and len(files) > 50
    assert private_uses(ALLOWED), "the scan finds nothing even in jaxcoll/_jax.py: it is not looking"


def test_the_scan_sees_the_legacy_modules_in_every_spelling(tmp_path):
    source = tmp_path / "legacy.py"
    source.write_text("import jax\nimport jax.core\nfrom jax import core\nfrom jax.interpreters import mlir\n"
                      "from jax.interpreters.ad import deflinear2\nx = jax.core.ShapedArray\n"
                      "from jax.extend.core import Primitive\nfrom jax.extend.mlir import ir\n")
    assert sorted({int(use.split(":")[0].split()[1]) for use in private_uses(source)}) == [2, 3, 4, 5, 6]


@pytest.mark.parametrize("path", [p for p in sources() if p != ALLOWED], ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_but_jaxcoll_jax_uses_private_jax(path):
    assert not private_uses(path), f"{path.relative_to(REPO)} uses private JAX: {private_uses(path)}; " \
                                   f"put it in jaxcoll/_jax.py with the public API it stands in for"


def test_each_private_use_in_jaxcoll_jax_names_the_public_api_it_stands_in_for():
    tree = ast.parse(ALLOWED.read_text())
    for fn in tree.body:
        if isinstance(fn, (ast.FunctionDef, ast.ClassDef)) and private_uses_in(fn):
            doc = ast.get_docstring(fn) or ""
            assert "public" in doc.lower(), f"_jax.{fn.name} uses private JAX without naming the public API"


def private_uses_in(fn: ast.FunctionDef | ast.ClassDef) -> bool:
    return any(isinstance(n, ast.ImportFrom) and n.module and n.module.startswith(PRIVATE_MODULES)
               or isinstance(n, ast.Attribute) and n.attr in PRIVATE_ATTRIBUTES for n in ast.walk(fn))
