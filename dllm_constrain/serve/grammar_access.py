"""What a request's grammar field (`structured_outputs.grammar`, `guided_grammar`) may name: grammar text, a
shipped grammar's name, or the name of a grammar in the directory the operator allows (`--grammar-dir`). Never a
path.

The library's `load_grammar` reads any file its caller names, which is right for the Python API (the caller is
the operator) and wrong for a request: a path in a request would let any client read, or probe for, files the
server can read. So the server resolves the field here, before the library sees it, and hands on only text:

- a shipped name (`json`, `sql`, `csv:4`, ...) becomes its text without touching the file system;
- a bare name (letters, digits, `_`, `-`, `.`; no separator, no `..`) is looked up in the operator's directory
  only: the resolved file (symlinks followed) must lie inside it, be a regular file of at most `max_bytes`, and
  be UTF-8 text; otherwise the answer is "unknown grammar name", the same whether or not such a file exists;
- a single word that looks like a path (a separator, a leading `~`, a `.lark` suffix) is refused as a path;
- anything else is grammar text, handed on with a line break so that no later step reads it as a file name.

Lark `%import` inside any grammar is confined by the constraint layer (constraints/cfg/frontend.py) to Lark's own
library and the shipped grammars, so grammar text cannot reach files either.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from dllm_constrain.grammars import SHIPPED, shipped_grammar
from dllm_constrain.serve.errors import GrammarNotAllowed

DEFAULT_MAX_GRAMMAR_BYTES = 1 << 20  # an operator's grammar file: 1 MiB (the shipped ones are < 4 KiB)
_BARE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_WORD = re.compile(r"^\S+$")


@dataclass(frozen=True)
class GrammarAccess:
    """How the server reads grammar fields. `directory`: the operator's grammar directory (None: shipped names
    and grammar text only); `max_bytes`: the largest grammar file read from it."""

    directory: Path | None = None
    max_bytes: int = DEFAULT_MAX_GRAMMAR_BYTES

    def __post_init__(self) -> None:
        if self.directory is not None:
            root = Path(os.path.realpath(self.directory))
            if not root.is_dir():
                raise ValueError(f"the grammar directory {self.directory} is not a directory")
            object.__setattr__(self, "directory", root)

    def resolve(self, value: str, param: str) -> str:
        """Grammar text for the request field `param` holding `value`; GrammarNotAllowed for a path or an
        unknown name (the library's InvalidGrammarError for bad parameters of a shipped name)."""
        stripped = value.strip()
        if "\n" in stripped or not _WORD.match(stripped) or ":" in stripped and not self._shipped_spec(stripped):
            return value if "\n" in value else value + "\n"  # grammar text
        text = shipped_grammar(stripped)
        if text is not None:
            return text
        if _BARE_NAME.match(stripped) and ".." not in stripped:
            text = self._from_directory(stripped)
            if text is not None:
                return text
            raise GrammarNotAllowed(self._unknown(stripped), param=param)
        raise GrammarNotAllowed("grammar file paths are not accepted over HTTP; send Lark grammar text or a grammar "
                                f"name ({self._names()})", param=param)

    @staticmethod
    def _shipped_spec(word: str) -> bool:
        """Whether `word` has the `name:params` shape of a shipped parameterised grammar (csv:4)."""
        return word.split(":", 1)[0].lower() in SHIPPED

    def _from_directory(self, name: str) -> str | None:
        """The text of `name` (or `name.lark`) in the operator's directory, or None when there is no such
        readable, small enough UTF-8 file inside it."""
        if self.directory is None:
            return None
        for candidate in (name, name + ".lark") if not name.endswith(".lark") else (name,):
            path = Path(os.path.realpath(self.directory / candidate))
            if path.parent != self.directory and self.directory not in path.parents:
                continue  # a symlink out of the directory
            try:
                if not path.is_file() or path.stat().st_size > self.max_bytes:
                    continue
                with open(path, "rb") as f:
                    raw = f.read(self.max_bytes + 1)
            except OSError:
                continue
            if len(raw) > self.max_bytes:
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if "\x00" in text:
                continue
            return text if "\n" in text else text + "\n"
        return None

    def _names(self) -> str:
        names = "shipped grammars: " + ", ".join(SHIPPED)
        return names + "; or a grammar of the server's grammar directory" if self.directory is not None else names

    def _unknown(self, name: str) -> str:
        shown = name if len(name) <= 64 else name[:64] + "..."
        return f"unknown grammar name {shown!r} ({self._names()}); send Lark grammar text otherwise"
