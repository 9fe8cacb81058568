"""The native sources name each of their own includes from the checkout root ("csrc/executor.hpp",
"csrc/cuda/launcher.hpp", "xla_ffi/handler.hpp"): a bare name would mean whichever folder the include path happens
to list first, and would change meaning the day two folders share a file name. CMakeLists.txt puts only the root
on the path."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def test_every_quoted_include_names_an_existing_file_from_the_root():
    wrong = []
    for folder in ("csrc", "xla_ffi"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix not in (".cc", ".hpp", ".cu", ".cuh"):
                continue
            for name in INCLUDE.findall(path.read_text()):
                if name.startswith("xla/ffi/"):  # the jaxlib's FFI headers, on their own include path
                    continue
                if not (name.startswith(("csrc/", "xla_ffi/")) and (REPO / name).is_file()):
                    wrong.append(f"{path.relative_to(REPO)}: #include \"{name}\"")
    assert not wrong, "includes that do not name their file from the checkout root:\n" + "\n".join(wrong)
