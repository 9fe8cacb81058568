"""The README's first command sets up everything its examples need: every module an example in examples/ imports is
the standard library's, jaxcoll's, another example's, or a package that command installs (jaxcoll's dependencies
and the extras it names). pyproject.toml is the list checked against; the distribution names of these packages are
their module names."""

import ast
import pathlib
import re
import sys
import tomllib

REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def first_command() -> str:
    """The README's first indented command line under "Two commands"."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Two commands", 1)[1]
    return next(line.strip() for line in section.splitlines() if line.startswith("    ") and line.strip())


def requirement_name(spec: str) -> str:
    return re.split(r"[\s<>=!~;\[]", spec, maxsplit=1)[0].lower().replace("-", "_")


def installed_by(command: str) -> set[str]:
    """The packages `pip install -e .[extras]` in `command` brings, by name."""
    match = re.search(r"pip install -e \"?\.(?:\[([\w,]+)\])?\"?", command)
    assert match, f"the README's first command installs no checkout: {command!r}"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in (match.group(1) or "").split(","):
        if extra:
            specs += project["optional-dependencies"][extra]
    return {requirement_name(s) for s in specs}


def imported(path: pathlib.Path) -> set[str]:
    """Top-level names of every module the file imports, at any depth of its code."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_readme_first_command_is_one_line_that_installs_and_runs_the_bench():
    command = first_command()
    assert "pip install" in command and command.endswith("python3 -m jaxcoll bench"), command


def test_readme_first_command_installs_what_every_example_imports():
    packages = installed_by(first_command())
    local = {p.stem for p in EXAMPLES.rglob("*.py")}
    missing = {}
    for path in sorted(EXAMPLES.rglob("*.py")):
        outside = imported(path) - set(sys.stdlib_module_names) - local - {"jaxcoll"}
        if outside - packages:
            missing[str(path.relative_to(REPO))] = sorted(outside - packages)
    assert not missing, f"the README's first command does not install what these examples import: {missing}"


def test_readme_names_only_examples_that_exist():
    named = set(re.findall(r"examples/[\w/]+\.py", (REPO / "README.md").read_text()))
    assert named, "the README names no example"
    assert all((REPO / n).is_file() for n in named), named


def test_test_extra_includes_the_examples_extra():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras["examples"]) <= set(extras["test"])


def test_examples_write_no_file_into_the_checkout_by_default():
    """An output path's default is the temporary directory or none; a path under the checkout is the user's to
    give (`--out docs/x.png`)."""
    for path in sorted(EXAMPLES.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                for kw in node.keywords:
                    if kw.arg == "default" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                        assert not kw.value.value.endswith((".png", ".svg", ".json", ".md", ".xml")), (
                            f"{path.name}: an option writes to {kw.value.value!r} unless told otherwise")
