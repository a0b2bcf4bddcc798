"""`$ref` resolution inside one schema document: `$id` / `id` resources, `$anchor`s, JSON pointers, and the
count of references entered on the current path (recursion is unrolled to `max_recursion_depth` levels).

The compiler memoises the language of a subschema per (subschema, counts of the references it can reach),
so the resolver also answers which references are reachable from a subschema."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator
from urllib.parse import unquote, urljoin

from ...errors import InvalidSchemaError, UnsupportedSchemaError
from .keywords import ANNOTATIONS

# keywords whose values are data, not subschemas (never searched for `$id`s or `$ref`s)
_DATA_KEYWORDS = ("enum", "const", "examples", "default")
_MAX_REF_CHAIN = 64  # bare `$ref`s followed in a row before a chain counts as a cycle


def join_uri(base: str, ref: str) -> str:
    """`ref` resolved against `base` (fragments appended to any scheme, e.g. urn:)."""
    if ref.startswith("#"):
        return base.partition("#")[0] + ref
    if not base:
        return ref
    return urljoin(base, ref)


def escape_pointer(tok: str) -> str:
    return str(tok).replace("~", "~0").replace("/", "~1")


def unescape_pointer(tok: str) -> str:
    return tok.replace("~1", "/").replace("~0", "~")


class RefResolver:
    """Resolves `$ref`s of one document and counts the references entered on the path being compiled."""

    def __init__(self, root: Any, max_recursion_depth: int):
        self.root = root
        self.max_recursion_depth = max_recursion_depth
        self.counts: dict[str, int] = {}  # absolute URI -> times entered on the current path
        self._uri_index: tuple[dict[str, Any], str] | None = None
        self._bases: dict[int, str] = {}
        self._direct_memo: dict = {}
        self._reach_memo: dict = {}

    # -------------------------------------------------------------- resolution
    def resolve(self, ref: str, path: str, base: str | None = None) -> tuple[Any, str]:
        """The schema a $ref points to, resolved against `base` (the URI of the resource holding the $ref:
        the nearest enclosing `$id`), and the target's absolute URI (the key for recursion counting)."""
        if not isinstance(ref, str):
            raise InvalidSchemaError(f"$ref at {path} must be a string")
        resources, root_base = self._resources()
        found = self._lookup(ref, root_base if base is None else base, resources, root_base, path)
        if found is None and ref.startswith("#") and base not in (None, root_base):
            # a fragment that does not resolve inside the enclosing `id` resource: many real schemas
            # (draft-04 `id`s on definitions) mean the whole document, as most validators read them
            found = self._lookup(ref, root_base, resources, root_base, path)
        if found is None:
            raise InvalidSchemaError(f"unresolvable $ref {ref!r} at {path}")
        return found

    def resolve_in(self, s: dict, path: str) -> tuple[Any, str]:
        """The target of the `$ref` of s, resolved against s's own base URI."""
        return self.resolve(s["$ref"], path, self.base_of(s))

    def _lookup(self, ref: str, base: str, resources: dict[str, Any], root_base: str,
                path: str) -> tuple[Any, str] | None:
        """(target, absolute URI) of `ref` against `base`, or None when the document has no such target."""
        uri = join_uri(base, ref)
        doc_uri, _, frag = uri.partition("#")
        doc = self.root if doc_uri == root_base else resources.get(doc_uri)
        if doc is None:
            raise UnsupportedSchemaError("$ref", path, f"remote reference {ref!r} (only references inside the schema)")
        if frag == "" or frag.startswith("/"):
            target = doc
            for tok in frag.split("/")[1:] if frag else []:
                tok = unquote(unescape_pointer(tok))
                if isinstance(target, dict) and tok in target:
                    target = target[tok]
                elif isinstance(target, list) and tok.isdigit() and int(tok) < len(target):
                    target = target[int(tok)]
                else:
                    return None
            return target, uri
        target = resources.get(uri)
        return None if target is None else (target, uri)

    def base_of(self, s: Any) -> str | None:
        """The base URI of a schema of the document (None: the root's, e.g. for the compiler's own dicts)."""
        self._resources()
        return self._bases.get(id(s))

    def root_base(self) -> str:
        return self._resources()[1]

    def _resources(self) -> tuple[dict[str, Any], str]:
        """Absolute URI (of each `$id` resource, and `uri#anchor` of each anchor) -> schema, and the root's
        base URI. Also fills id(dict) -> base URI for every schema of the document."""
        if self._uri_index is None:
            root_id = self.root.get("$id", self.root.get("id")) if isinstance(self.root, dict) else None
            root_base = root_id.partition("#")[0] if isinstance(root_id, str) else ""
            index: dict[str, Any] = {}
            bases: dict[int, str] = {}
            stack: list[tuple[Any, str]] = [(self.root, root_base)]
            while stack:
                x, base = stack.pop()
                if isinstance(x, list):
                    stack.extend((v, base) for v in x)
                    continue
                if not isinstance(x, dict):
                    continue
                base = _index_resource(x, base, index)
                bases[id(x)] = base
                stack.extend((v, base) for k, v in x.items() if k not in _DATA_KEYWORDS)
            self._uri_index = (index, root_base)
            self._bases = bases
        return self._uri_index

    # -------------------------------------------------------------- drafts
    def declares_draft(self, *drafts: str) -> bool:
        """Whether the root's `$schema` names one of these drafts."""
        declared = self.root.get("$schema", "") if isinstance(self.root, dict) else ""
        return isinstance(declared, str) and any(d in declared for d in drafts)

    def siblings(self, s: dict) -> dict:
        """The validation keywords next to a `$ref`. Up to draft 7 (by the root's `$schema`) a `$ref`
        replaces its whole schema object and its siblings are ignored; from 2019-09 on they apply with it."""
        if self.declares_draft("draft-03", "draft-04", "draft-06", "draft-07"):
            return {}
        return {k: v for k, v in s.items() if k != "$ref" and k not in ANNOTATIONS}

    # -------------------------------------------------------------- recursion counting
    def deref(self, s: Any, path: str) -> tuple[Any, list]:
        """Follow a chain of bare $refs (for merging). Returns (schema, refs entered); (False, []) when
        the recursion bound is reached."""
        entered = []
        seen = 0
        while isinstance(s, dict) and "$ref" in s:
            target, ref = self.resolve_in(s, path)
            rest = self.siblings(s)
            cnt = self.counts.get(ref, 0)
            if cnt >= self.max_recursion_depth:
                for r in entered:
                    self.leave(r)
                return False, []
            self.counts[ref] = cnt + 1
            entered.append(ref)
            if rest:
                s = {"allOf": [target, rest]}
                break
            s = target
            seen += 1
            if seen > _MAX_REF_CHAIN:
                raise InvalidSchemaError(f"$ref cycle at {path}")
        return s, entered

    def leave(self, ref: str) -> None:
        c = self.counts.get(ref, 0)
        if c <= 1:
            self.counts.pop(ref, None)
        else:
            self.counts[ref] = c - 1

    def leave_all(self, refs: list[str]) -> None:
        for r in refs:
            self.leave(r)

    @contextmanager
    def dereferenced(self, s: Any, path: str) -> Iterator[Any]:
        """s with its chain of bare $refs followed, the references counted as entered while in the block."""
        x, entered = self.deref(s, path)
        try:
            yield x
        finally:
            self.leave_all(entered)

    # -------------------------------------------------------------- reachability (memo keys)
    def memo_key(self, s: dict) -> tuple:
        """The key of s's language: s, and the counts of the references reachable from s (the only ones
        that can change what s compiles to)."""
        rc = self.counts
        if not rc:
            return (id(s), ())
        reach = self._reach(s)
        return (id(s), tuple(sorted((r, c) for r, c in rc.items() if r in reach)))

    def _direct_refs(self, x) -> frozenset:
        """$ref strings appearing in x (not following them). Memoised per dict."""
        if isinstance(x, dict):
            hit = self._direct_memo.get(id(x))
            if hit is not None and hit[0] is x:
                return hit[1]
            out = set()
            r = x.get("$ref")
            if isinstance(r, str):
                out.add(join_uri(self.base_of(x) or self.root_base(), r))
            for k, v in x.items():
                if isinstance(v, (dict, list)) and k not in _DATA_KEYWORDS:
                    out |= self._direct_refs(v)
            res = frozenset(out)
            self._direct_memo[id(x)] = (x, res)
            return res
        if isinstance(x, list):
            out = set()
            for v in x:
                if isinstance(v, (dict, list)):
                    out |= self._direct_refs(v)
            return frozenset(out)
        return frozenset()

    def _reach(self, s) -> frozenset:
        """Every $ref reachable from s, following references transitively."""
        hit = self._reach_memo.get(id(s))
        if hit is not None and hit[0] is s:
            return hit[1]
        seen = set(self._direct_refs(s))
        todo = list(seen)
        while todo:
            r = todo.pop()
            try:
                target, _ = self.resolve(r, "#")
            except (InvalidSchemaError, UnsupportedSchemaError):
                continue
            for r2 in self._direct_refs(target):
                if r2 not in seen:
                    seen.add(r2)
                    todo.append(r2)
        res = frozenset(seen)
        self._reach_memo[id(s)] = (s, res)
        return res


def _index_resource(x: dict, base: str, index: dict[str, Any]) -> str:
    """Record x's `$id`/`id` and `$anchor` in `index`; returns the base URI of x's subschemas."""
    for key in ("$id", "id"):
        i = x.get(key)
        if not isinstance(i, str):
            continue
        if i.startswith("#"):  # draft-4/6/7 location-independent identifier
            index.setdefault(base + i, x)
        else:
            base = join_uri(base, i).partition("#")[0]
            index.setdefault(base, x)
        break
    a = x.get("$anchor")
    if isinstance(a, str):
        index.setdefault(base + "#" + a, x)
    return base
