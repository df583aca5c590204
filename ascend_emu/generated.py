"""A table generated from the code and kept in a Markdown file between two marker lines (NUMERICS.md's
assumed-parameters table, its op-sources table): one way to print it, find it in the file and rewrite it, so a
test can hold the file to exactly the generated block.
"""
from __future__ import annotations

import os
import sys

from .errors import AscendEmuError

#: NUMERICS.md of this checkout
NUMERICS_MD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "NUMERICS.md")


class GeneratedTable:
    """The block ``begin``, ``make()``, ``end`` of a file; ``what`` names it in errors."""

    def __init__(self, begin: str, end: str, make, what: str):
        self.begin, self.end, self.make, self.what = begin, end, make, what

    def block(self) -> str:
        return f"{self.begin}\n{self.make()}\n{self.end}"

    def table_in(self, text: str) -> str:
        """The generated block as it stands in ``text`` (the file's content)."""
        if self.begin not in text or self.end not in text:
            raise AscendEmuError(f"NUMERICS.md has no {self.what} table markers")
        start = text.index(self.begin)
        return text[start:text.index(self.end, start) + len(self.end)]

    def rewrite(self, path: str = NUMERICS_MD) -> bool:
        """Replace the table in ``path`` with the generated one; True if the file changed."""
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new = text.replace(self.table_in(text), self.block())
        if new != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
        return new != text

    def main(self, argv=None) -> int:
        """``--write [FILE]`` rewrites the table in FILE (default NUMERICS.md); otherwise prints the block."""
        argv = sys.argv[1:] if argv is None else argv
        if argv[:1] == ["--write"]:
            path = argv[1] if len(argv) > 1 else NUMERICS_MD
            print(f"{path}: {'updated' if self.rewrite(path) else 'already current'}")
        else:
            print(self.block())
        return 0
