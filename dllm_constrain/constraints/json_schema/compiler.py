"""SchemaCompiler: a JSON Schema to the regex AST of its JSON texts (see the package docstring for the
narrowings), and schema_to_regex_ast, the entry point."""
from __future__ import annotations

import json
import math
import re
import warnings
from dataclasses import fields
from typing import Any

from ...errors import (InvalidRegexError, InvalidSchemaError, UnknownKeywordError, UnknownKeywordWarning,
                       UnsatisfiableSchemaError, UnsupportedSchemaError)
from .. import dfa_ops
from .. import numeric as N
from .. import regex_ast as A
from ..deadline import Deadline
from ..formats import STANDARD_FORMATS, FormatLengthTooLarge, format_node, with_length
from ..object_members import object_members
from ..regex_parser import parse_regex, search_language
from .json_text import (ANY_STRING_BODY, FLOAT_EXACT, ZERO_FRACTION, has_other_spellings, json_encode_string_body,
                        json_literal, strings_except, value_spellings)
from .keywords import (ALL_TYPES, ANNOTATIONS, APPLICATORS, ARRAY_KW, KNOWN_UNSUPPORTED, NEGATED_BOUND, NUMBER_KW,
                       OBJECT_KW, SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_VALUES, STRING_KW, SUPPORTED, independent_keyword_groups)
from .options import SchemaOptions, without_narrowings
from .patterns import all_readings_pattern, pattern_matches
from .values import canon, intersect_types, is_number, json_eq, kind_of, kinds_of_types, type_of, types_of_kinds


def join_uri(base: str, ref: str) -> str:
    """`ref` resolved against `base` (fragments appended to any scheme, e.g. urn:)."""
    if ref.startswith("#"):
        return base.partition("#")[0] + ref
    if not base:
        return ref
    from urllib.parse import urljoin

    return urljoin(base, ref)


def escape_pointer(tok: str) -> str:
    return str(tok).replace("~", "~0").replace("/", "~1")


def unescape_pointer(tok: str) -> str:
    return tok.replace("~1", "/").replace("~0", "~")



class SchemaCompiler:
    def __init__(self, root: Any, opts: SchemaOptions, deadline: Deadline | None):
        if not isinstance(root, (dict, bool)):
            raise InvalidSchemaError("a JSON Schema must be an object or a boolean")
        self.root = root
        self.opts = opts
        self.deadline = deadline
        self.ref_counts: dict[str, int] = {}
        self.memo: dict = {}
        self._validator = None
        self._keep: list = []  # keep merged dicts alive (memo keys use id())
        self.ws = (A.EMPTY if opts.whitespace == "compact"
                   else A.rep(A.chars([(0x20, 0x20), (0x0A, 0x0A), (0x0D, 0x0D), (0x09, 0x09)]), 0,
                              opts.flexible_whitespace_max))
        self._any_cache: dict[int, A.Node] = {}
        self._uri_index: tuple[dict[str, Any], str] | None = None
        self._bases: dict[int, str] = {}
        self._enum_sets: dict = {}
        self._direct_memo: dict = {}
        self._conjunction_leaves = 0  # merged conjunctions compiled so far (bounds if/else distribution)
        self._reach_memo: dict = {}
        self._enc_memo: dict = {}
        self.unsat: list[str] = []  # why sub-languages came out empty (for UnsatisfiableSchemaError)

    # -------------------------------------------------------------- validation helper
    def validator(self):
        if self._validator is None:
            import jsonschema
            from jsonschema import validators

            cls = validators.validator_for(self.root if isinstance(self.root, dict) else {},
                                           default=jsonschema.Draft202012Validator)
            # values the compiler keeps (enum members, declared names against propertyNames) must match
            # their patterns for Python's `re` and ECMA-262 alike
            cls = validators.extend(cls, {"pattern": all_readings_pattern})
            try:
                self._validator = cls(self.root, format_checker=cls.FORMAT_CHECKER)
            except Exception as e:  # pragma: no cover
                raise InvalidSchemaError(f"schema rejected by jsonschema: {e}") from None
        return self._validator

    def is_valid(self, instance, schema) -> bool:
        try:
            return self.validator().evolve(schema=schema).is_valid(instance)
        except UnsupportedSchemaError:
            raise
        except Exception as e:
            raise UnsupportedSchemaError("enum", "#", f"cannot validate enum values: {type(e).__name__}: {e}") from None

    # -------------------------------------------------------------- $ref
    def resolve_ref(self, ref: str, path: str, base: str | None = None) -> tuple[Any, str]:
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

    def _lookup(self, ref: str, base: str, resources: dict[str, Any], root_base: str,
                path: str) -> tuple[Any, str] | None:
        """(target, absolute URI) of `ref` against `base`, or None when the document has no such target."""
        uri = join_uri(base, ref)
        doc_uri, _, frag = uri.partition("#")
        doc = self.root if doc_uri == root_base else resources.get(doc_uri)
        if doc is None:
            raise UnsupportedSchemaError("$ref", path, f"remote reference {ref!r} (only references inside the schema)")
        if frag == "" or frag.startswith("/"):
            from urllib.parse import unquote

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

    def _base_of(self, s: Any) -> str | None:
        """The base URI of a schema of the document (None: the root's, e.g. for the compiler's own dicts)."""
        self._resources()
        return self._bases.get(id(s))

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
                bases[id(x)] = base
                stack.extend((v, base) for k, v in x.items() if k not in ("enum", "const", "examples", "default"))
            self._uri_index = (index, root_base)
            self._bases = bases
        return self._uri_index

    # -------------------------------------------------------------- reachability of $refs (memo keys)
    def _direct_refs(self, x) -> frozenset:
        """$ref strings appearing in x (not following them). Memoised per dict."""
        if isinstance(x, dict):
            hit = self._direct_memo.get(id(x))
            if hit is not None and hit[0] is x:
                return hit[1]
            out = set()
            r = x.get("$ref")
            if isinstance(r, str):
                out.add(join_uri(self._base_of(x) or self._resources()[1], r))
            for k, v in x.items():
                if isinstance(v, (dict, list)) and k not in ("enum", "const", "examples", "default"):
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
                target, _ = self.resolve_ref(r, "#")
            except (InvalidSchemaError, UnsupportedSchemaError):
                continue
            for r2 in self._direct_refs(target):
                if r2 not in seen:
                    seen.add(r2)
                    todo.append(r2)
        res = frozenset(seen)
        self._reach_memo[id(s)] = (s, res)
        return res

    # -------------------------------------------------------------- entry
    def compile_root(self) -> A.Node:
        return self.compile(self.root, "#")

    def check_deadline(self):
        if self.deadline is not None:
            self.deadline.check()

    def compile(self, s: Any, path: str) -> A.Node:
        self.check_deadline()
        if s is True:
            return self.any_value(self.opts.any_json_depth)
        if s is False:
            return A.NOTHING
        if not isinstance(s, dict):
            raise InvalidSchemaError(f"schema at {path} must be an object or a boolean, got {type(s).__name__}")
        rc = self.ref_counts
        if rc:
            reach = self._reach(s)
            key = (id(s), tuple(sorted((r, c) for r, c in rc.items() if r in reach)))
        else:
            key = (id(s), ())
        hit = self.memo.get(key)
        if hit is not None and hit[0] is s:
            return hit[1]
        node = self._compile_dict(s, path)
        self.memo[key] = (s, node)
        return node

    def _check_keywords(self, s: dict, path: str) -> None:
        # (keywords outside the vocabularies are reported or refused before compiling: see unknown_keywords)
        for k in s:
            if k in KNOWN_UNSUPPORTED:
                raise UnsupportedSchemaError(k, path)

    def _implied_discriminator(self, s: dict, path: str) -> bool:
        """OpenAPI's `discriminator` (Pydantic emits it beside a tagged union's oneOf) has no meaning for a
        JSON Schema validator; it is taken as an annotation only when the branches already decide what an
        OpenAPI reader would check: each branch is a $ref that requires `propertyName` and fixes it (const or
        enum) to strings that `mapping` sends to that same $ref. Otherwise it is reported as unknown."""
        d = s.get("discriminator")
        branches = s.get("oneOf", s.get("anyOf"))
        if not (isinstance(d, dict) and isinstance(d.get("propertyName"), str) and isinstance(d.get("mapping"), dict)
                and isinstance(branches, list) and branches):
            return False
        name, mapping = d["propertyName"], d["mapping"]
        for b in branches:
            ref = b.get("$ref") if isinstance(b, dict) else None
            if not isinstance(ref, str):
                return False
            try:
                target, _uri = self.resolve_ref(ref, path, self._base_of(s))
            except (InvalidSchemaError, UnsupportedSchemaError):
                return False
            if not isinstance(target, dict) or name not in (target.get("required") or []):
                return False
            prop = (target.get("properties") or {}).get(name)
            vals = ([prop["const"]] if "const" in prop else prop.get("enum")) if isinstance(prop, dict) else None
            if not isinstance(vals, list) or not vals or any(not isinstance(v, str) or mapping.get(v) != ref
                                                             for v in vals):
                return False
        return True

    def unknown_keywords(self) -> list[tuple[str, str]]:
        """(JSON pointer, keyword) of every keyword outside the JSON Schema vocabularies in the subschemas
        reachable from the root (following local $refs); annotations are not listed."""
        out: list[tuple[str, str]] = []
        seen: set[int] = set()
        stack: list[tuple[Any, str]] = [(self.root, "#")]
        while stack:
            x, path = stack.pop()
            if not isinstance(x, dict) or id(x) in seen:
                continue
            seen.add(id(x))
            for k, v in x.items():
                sub = f"{path}/{escape_pointer(k)}"
                if k not in ANNOTATIONS and k not in SUPPORTED and k not in KNOWN_UNSUPPORTED \
                        and not (k == "discriminator" and self._implied_discriminator(x, path)):
                    out.append((path, k))
                    continue
                if k in SCHEMA_MAPS and isinstance(v, dict):
                    stack.extend((w, f"{sub}/{escape_pointer(n)}") for n, w in v.items())
                elif k in SCHEMA_LISTS and isinstance(v, list):
                    stack.extend((w, f"{sub}/{i}") for i, w in enumerate(v))
                elif k in SCHEMA_VALUES:
                    stack.append((v, sub))
                elif k == "$ref" and isinstance(v, str):
                    try:
                        target, uri = self.resolve_ref(v, path, self._base_of(x))
                    except (InvalidSchemaError, UnsupportedSchemaError):
                        continue  # (compiling reports it)
                    stack.append((target, uri))
        return sorted(set(out))

    def _compile_dict(self, s: dict, path: str) -> A.Node:
        self._check_keywords(s, path)
        # ---- applicators that combine whole schemas
        if "$ref" in s:
            target, ref = self.resolve_ref(s["$ref"], path, self._base_of(s))
            rest = self._ref_siblings(s)
            cnt = self.ref_counts.get(ref, 0)
            if cnt >= self.opts.max_recursion_depth:
                return A.NOTHING  # recursion bound reached: this branch is not generated
            self.ref_counts[ref] = cnt + 1
            try:
                if not rest:
                    return self.compile(target, ref)
                # the schema holding the $ref stays the base of the conjunction (for unevaluatedProperties)
                both = {**rest, "allOf": [target] + list(rest.get("allOf", []))}
                self._keep.append(both)
                return self.compile(both, path)
            finally:
                if cnt == 0:
                    del self.ref_counts[ref]
                else:
                    self.ref_counts[ref] = cnt
        s = self._lower_dependent_schemas(s, path)
        if "allOf" in s or "anyOf" in s or "oneOf" in s or "not" in s or "if" in s:
            return self._compile_applicators(s, path)
        return self._compile_simple(s, path)

    def _lower_dependent_schemas(self, s: dict, path: str) -> dict:
        """`dependentSchemas` (and `dependencies` with schema values) as applicators: for each name a with
        schema S, a non-object, or an object without a, or an object with a that satisfies S (exact)."""
        deps = dict(s.get("dependentSchemas") or {})
        if not isinstance(deps, dict):
            raise InvalidSchemaError(f"dependentSchemas at {path} must be an object")
        old = s.get("dependencies")
        if isinstance(old, dict):
            deps.update({a: v for a, v in old.items() if not isinstance(v, list)})
        if not deps:
            return s
        rest = {k: v for k, v in s.items() if k != "dependentSchemas"}
        if isinstance(old, dict):
            arrays = {a: v for a, v in old.items() if isinstance(v, list)}
            rest.pop("dependencies")
            if arrays:
                rest["dependencies"] = arrays
        groups = []
        for a, sub in deps.items():
            if sub is True or sub == {}:
                continue
            groups.append({"anyOf": [{"type": [t for t in ALL_TYPES if t != "object"]},
                                     {"type": "object", "properties": {a: False}},
                                     {"allOf": [{"type": "object", "required": [a]}, sub]}]})
        if len(groups) > self.opts.max_dependency_branches:
            raise UnsupportedSchemaError("dependentSchemas", path,
                                         f"more than {self.opts.max_dependency_branches} schema dependencies")
        if groups:
            rest["allOf"] = list(rest.get("allOf", [])) + groups
        self._keep.append(rest)
        return rest

    # -------------------------------------------------------------- allOf / anyOf / oneOf / not / if
    def _deref(self, s: Any, path: str) -> tuple[Any, list]:
        """Follow a chain of bare $refs (for merging). Returns (schema, refs entered)."""
        entered = []
        seen = 0
        while isinstance(s, dict) and "$ref" in s:
            target, ref = self.resolve_ref(s["$ref"], path, self._base_of(s))
            rest = self._ref_siblings(s)
            cnt = self.ref_counts.get(ref, 0)
            if cnt >= self.opts.max_recursion_depth:
                for r in entered:
                    self._leave(r)
                return False, []
            self.ref_counts[ref] = cnt + 1
            entered.append(ref)
            if rest:
                s = {"allOf": [target, rest]}
                break
            s = target
            seen += 1
            if seen > 64:
                raise InvalidSchemaError(f"$ref cycle at {path}")
        return s, entered

    def _leave(self, ref: str) -> None:
        c = self.ref_counts.get(ref, 0)
        if c <= 1:
            self.ref_counts.pop(ref, None)
        else:
            self.ref_counts[ref] = c - 1

    def _compile_applicators(self, s: dict, path: str) -> A.Node:
        base = {k: v for k, v in s.items() if k not in ("allOf", "anyOf", "oneOf", "not", "if", "then", "else")}
        if s.get("unevaluatedProperties", True) not in (True, {}) and self._annotations_are_positive(s, path):
            base["__unevaluated_root__"] = True
        conj: list = [base]
        if "allOf" in s:
            if not isinstance(s["allOf"], list) or not s["allOf"]:
                raise InvalidSchemaError(f"allOf at {path} must be a non-empty array")
            conj.extend(s["allOf"])
        disj_groups: list[tuple[str, list]] = []
        for kw in ("anyOf", "oneOf"):
            if kw in s:
                if not isinstance(s[kw], list) or not s[kw]:
                    raise InvalidSchemaError(f"{kw} at {path} must be a non-empty array")
                disj_groups.append((kw, s[kw]))
        if "not" in s:
            conj.append({"__not__": s["not"]})
        if "if" in s:
            cond = s["if"]
            then = s.get("then", True)
            els = s.get("else", True)
            # (if AND then) OR (NOT if AND else)
            disj_groups.append(("if", [{"allOf": [cond, then]}, {"allOf": [{"__not__": cond}, els]}]))
        outer_leaves, self._conjunction_leaves = self._conjunction_leaves, 0  # counted per distribution
        try:
            return self._compile_conjunction(conj, disj_groups, path)
        finally:
            self._conjunction_leaves = outer_leaves

    def _annotations_are_positive(self, s: dict, path: str) -> bool:
        """True when the properties the in-place applicators under s name may all count as evaluated for s's
        unevaluatedProperties: each conjunction we build from them then evaluates a subset of what the
        validator sees (a sound narrowing). Not so with `not`/`if` (their negations are compiled to
        positive schemas that name properties but produce no annotations), with an unevaluatedProperties
        below s (it sees only its own subtree) or with dynamic references."""
        stack: list = [(s, True)]
        seen: set[int] = set()
        while stack:
            x, is_root = stack.pop()
            if not isinstance(x, dict) or id(x) in seen:
                continue
            seen.add(id(x))
            if "not" in x or "if" in x or "$dynamicRef" in x or "$recursiveRef" in x:
                return False
            if not is_root and "unevaluatedProperties" in x:
                return False
            for kw in ("allOf", "anyOf", "oneOf"):
                if isinstance(x.get(kw), list):
                    stack.extend((y, False) for y in x[kw])
            for kw in ("dependentSchemas", "dependencies"):
                if isinstance(x.get(kw), dict):
                    stack.extend((y, False) for y in x[kw].values())
            if "$ref" in x:
                try:
                    target, _ = self.resolve_ref(x["$ref"], path, self._base_of(x))
                except (InvalidSchemaError, UnsupportedSchemaError):
                    return False
                stack.append((target, False))
        return True

    def _compile_conjunction(self, conj: list, disj_groups: list, path: str) -> A.Node:
        # flatten nested allOf and bare refs, pulling their anyOf/oneOf up
        flat: list[dict] = []
        entered: list[str] = []
        try:
            stack = list(reversed(conj))
            while stack:
                self.check_deadline()
                x = stack.pop()
                if x is True or x == {}:
                    continue
                if x is False:
                    return A.NOTHING
                if not isinstance(x, dict):
                    raise InvalidSchemaError(f"subschema at {path} must be an object or a boolean")
                if isinstance(x, dict) and "__not__" in x and len(x) == 1:
                    neg = self._negate(x["__not__"], path)
                    if neg is False:
                        return A.NOTHING
                    if neg is True:
                        continue
                    if "__exclude__" in neg:
                        flat.append(neg)
                    else:
                        stack.append(neg)
                    continue
                x, ent = self._deref(x, path)
                entered.extend(ent)
                if x is False:
                    return A.NOTHING
                if x is True:
                    continue
                if not isinstance(x, dict):
                    raise InvalidSchemaError(f"subschema at {path} must be an object or a boolean")
                self._check_keywords(x, path)
                x = self._lower_dependent_schemas(x, path)
                if any(k in x for k in ("allOf", "anyOf", "oneOf", "not", "if")):
                    rest = {k: v for k, v in x.items() if k not in ("allOf", "anyOf", "oneOf", "not", "if", "then", "else")}
                    flat.append(rest)
                    if "allOf" in x:
                        stack.extend(reversed(x["allOf"]))
                    for kw in ("anyOf", "oneOf"):
                        if kw in x:
                            if not isinstance(x[kw], list) or not x[kw]:
                                raise InvalidSchemaError(f"{kw} at {path} must be a non-empty array")
                            disj_groups.append((kw, x[kw]))
                    if "not" in x:
                        stack.append({"__not__": x["not"]})
                    if "if" in x:
                        cond = x["if"]
                        disj_groups.append(("if", [{"allOf": [cond, x.get("then", True)]},
                                                   {"allOf": [{"__not__": cond}, x.get("else", True)]}]))
                else:
                    flat.append(x)
            if not disj_groups:
                self._conjunction_leaves += 1
                merged = self.merge(flat, path)
                if merged is None:
                    return A.NOTHING
                return self._compile_simple(merged, path)
            if self._conjuncts_conflict(flat, path):
                return A.NOTHING  # prune before distributing the remaining disjunctions
            # distribute the first disjunction over the rest
            kw, branches = disj_groups[0]
            rest_groups = disj_groups[1:]
            if kw == "oneOf":
                branches = self._disjoint_branches(flat, branches, path)
            outs = []
            for k, b in enumerate(branches):
                self.check_deadline()
                if kw == "if" and k == 1 and self._conjunction_leaves > self.opts.max_conjunction_leaves:
                    # distributing many if/then/else over each other multiplies the cases: past the
                    # bound, values that fail `if` are not generated (a sound narrowing)
                    continue
                saved = dict(self.ref_counts)
                try:
                    outs.append(self._compile_conjunction(list(flat) + [b], list(rest_groups), f"{path}/{kw}/{k}"))
                except UnsupportedSchemaError as e:
                    if kw == "if" and k == 1 and e.keyword == "not":
                        # the `else` side needs the negation of `if`, which we cannot express: generate only
                        # values satisfying `if` and `then` (a sound narrowing)
                        self.ref_counts = saved
                        continue
                    raise
            return A.alt(*outs)
        finally:
            for r in entered:
                self._leave(r)

    def _conjuncts_conflict(self, flat: list[dict], path: str) -> bool:
        """A cheap unsatisfiability proof for a partial conjunction: disjoint `type`s, or objects only with a
        required property whose const/enum values the conjuncts leave empty (a discriminator chosen twice by
        if/then or oneOf branches). False means nothing proven."""
        types: set[str] | None = None
        required: set[str] = set()
        values: dict[str, list] = {}
        for x in flat:
            if "type" in x:
                t = self._type_set(x["type"], path)
                types = t if types is None else intersect_types(types, t)
                if not types:
                    return True
            req = x.get("required")
            if isinstance(req, list):
                required.update(r for r in req if isinstance(r, str))
            props = x.get("properties")
            if not isinstance(props, dict):
                continue
            for p, sub in props.items():
                if sub is False:
                    vals = []
                elif not isinstance(sub, dict):
                    continue
                elif "const" in sub:
                    vals = [sub["const"]]
                elif isinstance(sub.get("enum"), list):
                    vals = sub["enum"]
                else:
                    continue
                cur = values.get(p)
                values[p] = vals if cur is None else [v for v in cur if any(json_eq(v, w) for w in vals)]
        # required/properties bind objects only: other types satisfy them vacuously
        return types == {"object"} and any(not values[p] for p in required if p in values)

    # -------------------------------------------------------------- merging conjunctions
    def merge(self, schemas: list[dict], path: str) -> dict | None:
        """Merge a conjunction of (ref-free at top level, applicator-free) schemas into one dict.
        Returns None when provably unsatisfiable. Internal keys: __not__ (list), __patterns__ (list),
        __conj__ (the original conjuncts, for validating enum values)."""
        out: dict = {"__conj__": []}
        arrays: list[tuple[list, Any]] = []  # (prefixItems, items) of each conjunct that has either
        object_appl: list[tuple[bool, bool]] = []  # (has patternProperties, has additionalProperties) per conjunct
        for s0 in schemas:
            s = self._normalize_draft(s0)
            if "__exclude__" not in s0:
                out["__conj__"].append(s0)
            if "prefixItems" in s or "items" in s:
                prefix = s.get("prefixItems", [])
                if not isinstance(prefix, list):
                    raise InvalidSchemaError(f"prefixItems at {path} must be an array")
                arrays.append((prefix, s.get("items")))
            if "patternProperties" in s or s.get("additionalProperties", True) not in (True, {}):
                object_appl.append(("patternProperties" in s, s.get("additionalProperties", True) not in (True, {})))
            for k, v in s.items():
                if k in ANNOTATIONS or k in ("__conj__", "prefixItems", "items"):
                    continue
                if k == "__exclude__":
                    out.setdefault("__exclude__", []).extend(v)
                    continue
                if k not in out:
                    if k == "pattern":
                        out.setdefault("__patterns__", []).append(v)
                        continue
                    out[k] = v
                    continue
                cur = out[k]
                if k == "type":
                    t1 = self._type_set(cur, path)
                    t2 = self._type_set(v, path)
                    out[k] = sorted(intersect_types(t1, t2))
                    if not out[k]:
                        return None
                elif k == "enum":
                    out[k] = [x for x in cur if any(json_eq(x, y) for y in v)]
                elif k == "const":
                    if not json_eq(cur, v):
                        return None
                elif k in ("minimum", "minLength", "minItems", "minProperties"):
                    out[k] = max(cur, v)
                elif k in ("maximum", "maxLength", "maxItems", "maxProperties"):
                    out[k] = min(cur, v)
                elif k == "exclusiveMinimum":
                    out[k] = max(cur, v)
                elif k == "exclusiveMaximum":
                    out[k] = min(cur, v)
                elif k == "required":
                    out[k] = list(dict.fromkeys(list(cur) + list(v)))
                elif k == "properties":
                    merged_props = dict(cur)
                    for pk, pv in v.items():
                        merged_props[pk] = {"allOf": [merged_props[pk], pv]} if pk in merged_props else pv
                    out[k] = merged_props
                elif k in ("additionalProperties", "propertyNames"):
                    out[k] = {"allOf": [cur, v]}
                elif k == "patternProperties":
                    pp = dict(cur)
                    for pk, pv in v.items():
                        pp[pk] = {"allOf": [pp[pk], pv]} if pk in pp else pv
                    out[k] = pp
                elif k == "uniqueItems":
                    out[k] = bool(cur) or bool(v)
                elif k == "multipleOf":
                    if cur != v:
                        a, b = cur, v
                        if isinstance(a, int) and isinstance(b, int):
                            out[k] = a * b // math.gcd(a, b)
                        else:
                            raise UnsupportedSchemaError("multipleOf", path, "two different non-integer multipleOf in allOf")
                elif k == "format":
                    if cur != v:
                        out.setdefault("__formats__", []).append(v)
                elif k == "dependentRequired":
                    dr = {a: list(b) for a, b in cur.items()}
                    for a, b in v.items():
                        dr[a] = list(dict.fromkeys(dr.get(a, []) + list(b)))
                    out[k] = dr
                elif k in SUPPORTED or k in KNOWN_UNSUPPORTED:
                    if json.dumps(cur, sort_keys=True, default=str) != json.dumps(v, sort_keys=True, default=str):
                        raise UnsupportedSchemaError(k, path, "conflicting values in allOf")
        if arrays:
            self._merge_array_items(out, arrays)
        if any(pp for pp, _ in object_appl) and sum(1 for pp, ad in object_appl if pp or ad) > 1 and \
                any(ad for _, ad in object_appl):
            # a key matching one subschema's pattern must also satisfy another subschema's
            # additionalProperties unless that subschema declares or matches it: not tracked per key
            raise UnsupportedSchemaError("patternProperties", path,
                                         "in allOf next to another subschema's additionalProperties")
        # properties from one conjunct that another conjunct's additionalProperties governs
        self._fix_additional_in_conj(out, path)
        self._keep.append(out)
        return out

    @staticmethod
    def _merge_array_items(out: dict, arrays: list[tuple[list, Any]]) -> None:
        """prefixItems/items of several conjuncts. Each conjunct's `items` applies after its own prefix, so
        element k must satisfy, for every conjunct, its prefixItems[k] if it has one, else its `items`."""
        n = max(len(prefix) for prefix, _ in arrays)

        def conj(xs: list) -> Any:
            xs = [x for x in xs if x is not None and x is not True and x != {}]
            if not xs:
                return True
            return xs[0] if len(xs) == 1 else {"allOf": xs}

        if n:
            out["prefixItems"] = [conj([prefix[k] if k < len(prefix) else items for prefix, items in arrays])
                                  for k in range(n)]
        if any(items is not None for _, items in arrays):  # (present, even if true: unevaluatedItems)
            out["items"] = conj([items for _, items in arrays])

    def _fix_additional_in_conj(self, out: dict, path: str) -> None:
        conj = out["__conj__"]
        if len(conj) < 2:
            return
        props = out.get("properties")
        if not props:
            return
        new_props = dict(props)
        changed = False
        for c in conj:
            if "additionalProperties" not in c and "patternProperties" not in c:
                continue
            own = c.get("properties", {}) or {}
            pats = list((c.get("patternProperties") or {}).keys())
            addl = c.get("additionalProperties", True)
            for pk in props:
                if pk in own:
                    continue
                extra = []
                matched = False  # (under every reading)
                for p in pats:
                    if pattern_matches(p, pk, path, "any"):
                        extra.append(c["patternProperties"][p])
                        matched = matched or pattern_matches(p, pk, path, "all")
                if not matched and addl is not True:
                    extra.append(addl)
                if extra:
                    new_props[pk] = {"allOf": [new_props[pk]] + extra}
                    changed = True
        if changed:
            out["properties"] = new_props

    def _normalize_draft(self, s: dict) -> dict:
        """Draft-04 boolean exclusiveMinimum/Maximum, tuple `items`; minContains/maxContains without
        `contains` in the same schema mean nothing."""
        if "contains" not in s and ("minContains" in s or "maxContains" in s):
            s = {k: v for k, v in s.items() if k not in ("minContains", "maxContains")}
        if isinstance(s.get("exclusiveMinimum"), bool) or isinstance(s.get("exclusiveMaximum"), bool):
            s = dict(s)
            for ex, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
                if isinstance(s.get(ex), bool):
                    flag = s.pop(ex)
                    if flag and bound in s:
                        s[ex] = s.pop(bound)
        if isinstance(s.get("items"), list):
            s = dict(s)
            s["prefixItems"] = s.pop("items")
            if "additionalItems" in s:
                s["items"] = s.pop("additionalItems")
        elif "additionalItems" in s and "prefixItems" not in s:
            s = {k: v for k, v in s.items() if k != "additionalItems"}  # ignored without tuple items
        return s

    def _type_set(self, t, path: str) -> set[str]:
        if isinstance(t, str):
            t = [t]
        if not isinstance(t, list) or not t:
            raise InvalidSchemaError(f"'type' at {path} must be a string or a non-empty array")
        out = set()
        for x in t:
            if x == "any":
                out.update(ALL_TYPES)
                continue
            if x not in ALL_TYPES:
                raise InvalidSchemaError(f"unknown type {x!r} at {path}")
            out.add(x)
        return out

    # -------------------------------------------------------------- oneOf
    def _disjoint_branches(self, base: list[dict], branches: list, path: str) -> list:
        """Branches of a oneOf, narrowed (to the JSON types where they are provably disjoint from every other
        branch, and by forbidding properties other branches require) so that no output satisfies two."""
        infos = [self._branch_info(base, b, path) for b in branches]
        out = []
        dropped = []
        for i in range(len(branches)):
            forbid: list[str] = []
            kinds = set(infos[i]["kinds"]) if infos[i] is not None else set()
            for j in range(len(branches)):
                if i != j and kinds:
                    kinds &= self._kinds_failing(infos[i], infos[j], forbid)
                    if not kinds:
                        dropped.append((i, j))
            types = types_of_kinds(kinds)
            if not types:
                continue  # a branch whose outputs might satisfy another branch is not generated
            extra: list = []
            if kinds_of_types(types) != infos[i]["kinds"]:
                extra.append({"type": types})
            if forbid and "object" in types:
                extra.append({"properties": {p: False for p in forbid}})
            out.append({"allOf": [branches[i]] + extra} if extra else branches[i])
        if not out:
            i, j = dropped[0] if dropped else (0, 1)
            raise UnsupportedSchemaError("oneOf", path, f"branches {i} and {j} are not provably disjoint")
        return out

    def _branch_info(self, base: list[dict], b: Any, path: str) -> dict | None:
        """A summary of a branch for disjointness checks (None = unknown): the kinds of JSON values it
        accepts (JSON Schema semantics: an untyped schema accepts every type its keywords do not restrict),
        its finite set of values if any, and the merged schema (applicators dropped: a weaker schema)."""
        empty = {"kinds": set(), "schema": {}, "values": [], "branch": b}
        try:
            parts = [x for x in base if x] + [b]
            flat = []
            entered_all = []
            try:
                for x in parts:
                    if x is True:
                        continue
                    if x is False:
                        return empty
                    x, ent = self._deref(x, path)
                    entered_all.extend(ent)
                    if x is False:
                        return None  # recursion bound reached: the branch's language is not known here
                    if not isinstance(x, dict):
                        continue
                    if any(k in x for k in ("anyOf", "oneOf", "not", "if")):
                        x = {k: v for k, v in x.items() if k not in ("anyOf", "oneOf", "not", "if", "then", "else")}
                    if "allOf" in x:
                        for y in x["allOf"]:
                            y2, ent2 = self._deref(y, path)
                            entered_all.extend(ent2)
                            if isinstance(y2, dict):
                                flat.append({k: v for k, v in y2.items()
                                             if k not in ("anyOf", "oneOf", "not", "if", "allOf")})
                        x = {k: v for k, v in x.items() if k != "allOf"}
                    flat.append(x)
            finally:
                for r in entered_all:
                    self._leave(r)
            m = self.merge(flat, path) if flat else {"__conj__": []}
        except (UnsupportedSchemaError, InvalidSchemaError):
            return None
        if m is None:
            return empty
        kinds = kinds_of_types(self._type_set(m["type"], path) if "type" in m else ALL_TYPES)
        values = None
        if "const" in m:
            values = [m["const"]]
        elif "enum" in m:
            values = list(m["enum"])
        if values is not None:
            kinds &= {kind_of(v) for v in values}
        return {"kinds": kinds, "schema": m, "values": values, "branch": b}

    def _kinds_failing(self, a: dict | None, b: dict | None, forbid: list[str]) -> set[str]:
        """The kinds of values of branch a proven not to satisfy branch b (possibly after adding property
        names to `forbid`, which narrows a's objects)."""
        if a is None or b is None:
            return set()
        ka, kb = a["kinds"], b["kinds"]
        if not (ka & kb):
            return set(ka)
        safe = ka - kb
        if a["values"] is not None:
            try:
                return set(ka) if all(not self._valid_against_branch(v, b) for v in a["values"]) else safe
            except Exception:
                return safe
        if b["values"] is not None:
            # b only accepts its enumerated values: a's outputs fail b if a rejects them all
            try:
                return set(ka) if all(not self._valid_against_branch(v, a) for v in b["values"]) else safe
            except Exception:
                return safe
        if "object" in ka & kb and self._objects_fail(a, b, forbid):
            safe.add("object")
        return safe

    def _objects_fail(self, a: dict, b: dict, forbid: list[str]) -> bool:
        """True when no object generated for branch a satisfies branch b (possibly after forbidding names)."""
        # both objects (for the overlapping part)
        sa, sb = a["schema"], b["schema"]
        req_a = list(sa.get("required", []) or [])
        props_a = sa.get("properties", {}) or {}
        props_b = sb.get("properties", {}) or {}
        req_b = list(sb.get("required", []) or [])
        # a requires p and b forbids p / b's schema for p is disjoint from a's
        b_addl = sb.get("additionalProperties", True)
        b_pats = sb.get("patternProperties") or {}
        for p in req_a:
            if p not in props_b and b_addl is False and not any(pattern_matches(q, p, "#", "any") for q in b_pats):
                return True
            if p in props_b and p in props_a:
                pa = self._branch_info([], props_a[p], "#")
                pb = self._branch_info([], props_b[p], "#")
                if pb is not None and pb.get("schema") == {} and props_b[p] is False:
                    return True
                if props_b[p] is False:
                    return True
                if pa is not None and pa["kinds"] and self._kinds_failing(pa, pb, []) >= pa["kinds"]:
                    return True
        # narrow a: forbid a property that b requires and a does not
        for p in req_b:
            if p not in req_a:
                forbid.append(p)
                return True
        return False

    def _valid_against_branch(self, v, info: dict) -> bool:
        b = info.get("branch")
        if b is None:
            return True
        return self.is_valid(v, b)

    # -------------------------------------------------------------- simple schemas
    def _inferred_types(self, s: dict) -> set[str]:
        kws = set(s)
        types = set()
        if kws & OBJECT_KW:
            types.add("object")
        if kws & ARRAY_KW:
            types.add("array")
        if kws & (STRING_KW - {"format"}) or "__patterns__" in kws:
            types.add("string")
        if "format" in kws and s["format"] in STANDARD_FORMATS:
            types.add("string")
        if kws & NUMBER_KW:
            types.add("number")
        return types or set(ALL_TYPES)

    def _compile_simple(self, s: dict, path: str) -> A.Node:
        if "__conj__" not in s:
            s = self.merge([s], path)
            if s is None:
                return A.NOTHING
        # enum / const: the finite set of values that satisfy every conjunct
        if "const" in s or "enum" in s:
            return self._compile_enum(s, path)
        if "type" in s:
            types = self._type_set(s["type"], path)
        elif self.opts.untyped_types == "inferred":
            types = self._inferred_types(s)
            if types != set(ALL_TYPES):
                # the narrowing never empties a satisfiable schema: if the implied types admit no value,
                # the other types do (their keywords do not apply to them), as in the specification
                node = self._compile_types(s, path, types)
                if A.is_nothing(node):
                    node = self._compile_types(s, path, set(ALL_TYPES) - types - ({"integer"} if "number" in types
                                                                                else set()))
                return node
        else:
            types = set(ALL_TYPES)  # JSON Schema: keywords constrain only the values of their own type
        return self._compile_types(s, path, types)

    def _compile_types(self, s: dict, path: str, types: set[str]) -> A.Node:
        types = set(types)
        excluded = list(s.get("__exclude__", []))
        if "number" in types and "integer" in types:
            types.discard("integer")
        parts = []
        for t in ALL_TYPES:
            if t not in types:
                continue
            self.check_deadline()
            ex = [v for v in excluded if type_of(v) == t or (t == "number" and type_of(v) == "integer")
                  or (t == "integer" and type_of(v) == "integer")]
            if t == "null":
                node = A.NOTHING if ex else A.lit("null")
            elif t == "boolean":
                node = A.alt(*[A.lit(x) for x, v in (("true", True), ("false", False)) if not any(e is v for e in ex)])
            elif t == "integer":
                node = self._integer(s, path)
                if ex:
                    # every literal a reader may take for an excluded value (doubles round)
                    node = self._difference(node, [N.float_neighbourhood(v) for v in ex], "not", path)
            elif t == "number":
                if ex:
                    # no exponent spellings, then remove every decimal spelling of the excluded values
                    lo, ls, hi, hs = self._bounds(s, path)
                    node = self._number(s, path) if (lo is not None or hi is not None or "multipleOf" in s) \
                        else N.decimal_range(None, False, None, False)
                    node = self._difference(node, [N.float_neighbourhood(v) for v in ex], "not", path)
                else:
                    node = self._number(s, path)
            elif t == "string":
                node = self._string(s, path, excluded=ex)
            elif t == "array":
                if ex:
                    raise UnsupportedSchemaError("not", path, "excluding array values")
                node = self._array(s, path)
            else:
                if ex:
                    raise UnsupportedSchemaError("not", path, "excluding object values")
                node = self._object(s, path)
            parts.append(node)
        return A.alt(*parts)

    def _difference(self, node: A.Node, negs: list[A.Node], kw: str, path: str) -> A.Node:
        try:
            return dfa_ops.difference(node, [A.alt(*negs)], self.deadline, self.opts.intersection_limit)
        except dfa_ops.TooLarge:
            raise UnsupportedSchemaError(kw, path, "exclusion over a too complex language") from None

    def _negate(self, n: Any, path: str):
        """An equivalent positive schema for `not n` (or {"__exclude__": values}); UnsupportedSchemaError
        naming `not` for forms we cannot express."""
        n, ent = self._deref(n, path)
        try:
            if n is True:
                return False
            if n is False:
                return True
            if not isinstance(n, dict):
                raise InvalidSchemaError(f"'not' at {path} must hold a schema")
            n = self._normalize_draft(n)
            kws = {k for k in n if k not in ANNOTATIONS}
            if not kws:
                return False
            if kws == {"type"}:
                t = self._type_set(n["type"], path)
                rem = set(ALL_TYPES) - t
                if "integer" in t:
                    rem.discard("number")  # non-integer numbers are not expressible: narrow them away
                if "number" in t:
                    rem.discard("integer")
                return {"type": sorted(rem)} if rem else False
            if len(kws) == 1 and next(iter(kws)) in NEGATED_BOUND:
                k = next(iter(kws))
                v = n[k]
                if not is_number(v):
                    raise InvalidSchemaError(f"{k} at {path} must be a number")
                t, k2, shift = NEGATED_BOUND[k]
                if shift and v + shift < 0:
                    return False  # not {minLength: 0}: nothing
                return {"type": t, k2: v + shift}
            if kws in ({"enum"}, {"const"}, {"enum", "type"}, {"const", "type"}):
                vals = list(n["enum"]) if "enum" in n else [n["const"]]
                if "type" in n:
                    vals = [v for v in vals if self.is_valid(v, {"type": n["type"]})]
                return {"__exclude__": vals}
            if kws == {"required"}:
                ps = n["required"]
                if not isinstance(ps, list) or not ps:
                    return False
                alts = [{"properties": {p: False}} for p in ps]
                return {"type": "object", **({"anyOf": alts} if len(alts) > 1 else alts[0])}
            if kws <= {"properties", "required"} and isinstance(n.get("properties"), dict) and len(n["properties"]) == 1:
                (p, sub), = n["properties"].items()
                req = n.get("required", [])
                if req and req != [p]:
                    raise UnsupportedSchemaError("not", path, "not {properties, required} over different names")
                present_bad = {"required": [p], "properties": {p: {"not": sub}}}
                if req:
                    return {"type": "object", "anyOf": [{"properties": {p: False}}, present_bad]}
                return {"type": "object", **present_bad}
            if kws == {"not"}:
                return n["not"]
            if kws == {"anyOf"}:
                return {"allOf": [{"not": b} for b in n["anyOf"]]}
            if kws == {"allOf"}:
                return {"anyOf": [{"not": b} for b in n["allOf"]]}
            if kws == {"properties"} and isinstance(n["properties"], dict) and n["properties"]:
                # some declared property is present and fails its schema
                return {"type": "object", "anyOf": [{"required": [p], "properties": {p: {"not": sub}}}
                                                    for p, sub in n["properties"].items()]}
            groups = independent_keyword_groups(kws)
            if len(groups) > 1 and not (kws & APPLICATORS):
                # a schema is the conjunction of its independent keyword groups: not (A and B) = not A or not B
                return {"anyOf": [{"not": {k: n[k] for k in g}} for g in groups]}
            raise UnsupportedSchemaError("not", path, f"negation of {sorted(kws)}")
        finally:
            for r in ent:
                self._leave(r)

    def _valid_fast(self, v, c) -> bool:
        """is_valid, with a fast path for conjuncts that only restrict the type / enumerate values."""
        if isinstance(c, dict):
            kws = {k for k in c if k not in ANNOTATIONS}
            if kws <= {"type", "enum", "const"}:
                if "type" in c:
                    ts = self._type_set(c["type"], "#")
                    tv = type_of(v)
                    if not (tv in ts or (tv == "integer" and "number" in ts)):
                        return False
                if "const" in c and not json_eq(v, c["const"]):
                    return False
                if "enum" in c:
                    cache = self._enum_sets.get(id(c))
                    if cache is None or cache[0] is not c:
                        cache = (c, {canon(x) for x in c["enum"]} if isinstance(c["enum"], list) else set())
                        self._enum_sets[id(c)] = cache
                    if canon(v) not in cache[1]:
                        return False
                return True
        return self.is_valid(v, c)

    def _compile_enum(self, s: dict, path: str) -> A.Node:
        vals = [s["const"]] if "const" in s else s["enum"]
        if "enum" in s and "const" in s:
            vals = [v for v in s["enum"] if json_eq(v, s["const"])]
        if not isinstance(vals, list):
            raise InvalidSchemaError(f"enum at {path} must be an array")
        conj = s.get("__conj__", [])
        excl = s.get("__exclude__", [])
        keep = []
        seen: set[str] = set()
        excl_keys = {canon(e) for e in excl}
        for v in vals:
            kv = canon(v)
            if kv in seen or kv in excl_keys:
                continue
            seen.add(kv)
            if all(self._valid_fast(v, c) for c in conj):
                keep.append(v)
        if not keep:
            self.unsat.append(f"no value of the enum/const at {path} satisfies the schema")
            return A.NOTHING
        lits = []
        spelled = []  # values holding numbers: every decimal spelling of each number (1 == 1.0)
        for v in keep:
            try:
                lit = json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            except ValueError:
                continue
            if has_other_spellings(v):
                spelled.append(A.alt(A.lit(lit), value_spellings(v)))
            else:
                lits.append(lit)
        return A.alt(A.alt_literals(lits), *spelled) if lits else A.alt(*spelled)

    # -------------------------------------------------------------- numbers
    def _bounds(self, s: dict, path: str):
        lo = hi = None
        lo_strict = hi_strict = False
        for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
            if k in s and not is_number(s[k]):
                raise InvalidSchemaError(f"{k} at {path} must be a number")
        if "minimum" in s:
            lo = N.to_decimal(s["minimum"])
        if "exclusiveMinimum" in s:
            v = N.to_decimal(s["exclusiveMinimum"])
            if lo is None or v >= lo:
                lo, lo_strict = v, True
        if "maximum" in s:
            hi = N.to_decimal(s["maximum"])
        if "exclusiveMaximum" in s:
            v = N.to_decimal(s["exclusiveMaximum"])
            if hi is None or v <= hi:
                hi, hi_strict = v, True
        # readers take numbers as doubles (ECMA-262 always, Python for literals with a fraction): bounds
        # that rounding could cross are moved inward (strict ones, and any beyond 2**53), so every admitted
        # literal satisfies them exactly and as a double alike
        lo, lo_strict = N.float_safe_lower(lo, lo_strict)
        hi, hi_strict = N.float_safe_upper(hi, hi_strict)
        return lo, lo_strict, hi, hi_strict

    def _int_bounds(self, s, path):
        lo, ls, hi, hs = self._bounds(s, path)
        ilo = None if lo is None else (math.floor(lo) + 1 if ls else math.ceil(lo))
        ihi = None if hi is None else (math.ceil(hi) - 1 if hs else math.floor(hi))
        if ilo is not None and ihi is not None and ilo > ihi:
            self.unsat.append(f"no integer in the range at {path}")
            return None
        return ilo, ihi

    def _integer(self, s: dict, path: str) -> A.Node:
        """Integers in canonical digits, optionally followed by `.0...` (JSON Schema counts 1.0 as an
        integer). A validator reads "n.0" as a float, exact only up to 2**53: the suffix is allowed where
        float rounding cannot change the verdict (bounds of at most 2**53 without multipleOf, or a range
        within +-2**53 with it)."""
        digits = self._integer_digits(s, path)
        if A.is_nothing(digits):
            return A.NOTHING
        if not self._zero_fraction_integers():
            return digits
        b = self._int_bounds(s, path)
        lo, hi = b if b is not None else (None, None)
        small = [x is not None and abs(x) <= FLOAT_EXACT for x in (lo, hi)]
        if all(small) or ("multipleOf" not in s and all(ok or x is None for ok, x in zip(small, (lo, hi)))):
            return A.seq(digits, ZERO_FRACTION)
        return digits

    def _ref_siblings(self, s: dict) -> dict:
        """The validation keywords next to a `$ref`. Up to draft 7 (by the root's `$schema`) a `$ref`
        replaces its whole schema object and its siblings are ignored; from 2019-09 on they apply with it."""
        if self._declares_draft("draft-03", "draft-04", "draft-06", "draft-07"):
            return {}
        return {k: v for k, v in s.items() if k != "$ref" and k not in ANNOTATIONS}

    def _declares_draft(self, *drafts: str) -> bool:
        """Whether the root's `$schema` names one of these drafts."""
        declared = self.root.get("$schema", "") if isinstance(self.root, dict) else ""
        return isinstance(declared, str) and any(d in declared for d in drafts)

    def _zero_fraction_integers(self) -> bool:
        """Whether "1.0" is an integer here: from draft 6 on; draft-03/04 (by the root's `$schema`) say no."""
        if self.opts.integer_zero_fraction == "never":
            return False
        return not self._declares_draft("draft-03", "draft-04")

    def _integer_digits(self, s: dict, path: str) -> A.Node:
        b = self._int_bounds(s, path)
        if b is None:
            return A.NOTHING
        lo, hi = b
        node = N.int_range(lo, hi) if (lo is not None or hi is not None) else N.JSON_INT
        if "multipleOf" in s:
            m = s["multipleOf"]
            if not is_number(m) or m <= 0:
                raise InvalidSchemaError(f"multipleOf at {path} must be a positive number")
            if isinstance(m, float) and m.is_integer():
                m = int(m)
            if isinstance(m, float):
                if (1 / m).is_integer():
                    return node  # every integer is a multiple of 1/k
                raise UnsupportedSchemaError("multipleOf", path, f"non-integer multipleOf {m}")
            if m > 10000:
                raise UnsupportedSchemaError("multipleOf", path, f"multipleOf {m} too large")
            mult = N.int_multiple_of(m)
            if lo is None and hi is None:
                return mult
            try:
                return dfa_ops.intersect([node, mult], self.deadline, self.opts.intersection_limit)
            except dfa_ops.TooLarge:
                raise UnsupportedSchemaError("multipleOf", path, "range with multipleOf too large") from None
        return node

    def _number(self, s: dict, path: str) -> A.Node:
        if "multipleOf" in s:
            m = s["multipleOf"]
            if isinstance(m, int) or (isinstance(m, float) and m.is_integer()):
                return self._integer(s, path)  # only integer multiples of an integer: narrow to integers
            return self._float_multiples(s, m, path)
        lo, ls, hi, hs = self._bounds(s, path)
        if lo is None and hi is None:
            return N.JSON_NUMBER
        if lo is not None and hi is not None and (lo > hi or (lo == hi and (ls or hs))):
            self.unsat.append(f"empty numeric range at {path}: minimum {lo} / maximum {hi}")
            return A.NOTHING
        return N.decimal_range(lo, ls, hi, hs)

    def _float_multiples(self, s: dict, m, path: str, n_max: int = 1000) -> A.Node:
        """multipleOf a non-integer k: the multiples n*k, |n| <= n_max, that pass jsonschema's own float
        test (instance / k is an integer in float arithmetic) and the bounds -- a finite, sound set."""
        if not is_number(m) or m <= 0:
            raise InvalidSchemaError(f"multipleOf at {path} must be a positive number")
        lo, ls, hi, hs = self._bounds(s, path)
        k = N.to_decimal(m)
        texts = []
        for n in range(-n_max, n_max + 1):
            d = (k * n).normalize()
            if lo is not None and (d < lo or (ls and d == lo)):
                continue
            if hi is not None and (d > hi or (hs and d == hi)):
                continue
            txt = format(d, "f")
            if "." in txt:
                txt = txt.rstrip("0").rstrip(".")
            if txt in ("-0", ""):
                txt = "0"
            v = float(txt)
            q = v / float(m)
            try:
                if int(q) != q:
                    continue
            except (OverflowError, ValueError):
                continue
            texts.append(txt)
        small = A.alt_literals(sorted(set(texts))) if texts else A.NOTHING
        # the whole range: the multiples that every double reading accepts (see N.decimal_multiple_of)
        dm = N.decimal_multiple_of(k)
        if dm is not None:
            mult, bound = dm
            # (the automaton spells only magnitudes below `bound`: a bound beyond it needs no product)
            blo, bls = (None, False) if lo is None or lo <= -bound else (lo, ls)
            bhi, bhs = (None, False) if hi is None or hi >= bound else (hi, hs)
            if blo == 0 and not bls:  # `minimum: 0`, the common case: drop the sign instead
                mult, blo = N.decimal_multiple_of(k, negative=False)[0], None
            if blo is None and bhi is None:
                wide = mult
            elif blo is None or bhi is None or blo < bhi or (blo == bhi and not (bls or bhs)):
                try:
                    wide = dfa_ops.intersect([N.decimal_range(blo, bls, bhi, bhs), mult], self.deadline,
                                             self.opts.intersection_limit)
                except dfa_ops.TooLarge:
                    wide = A.NOTHING
            else:
                wide = A.NOTHING
            small = A.alt(small, wide)
        if A.is_nothing(small):
            self.unsat.append(f"no multiple of {m} in range at {path}")
            return A.NOTHING
        return small

    # -------------------------------------------------------------- strings
    def string_body_chars(self, s: dict, path: str, excluded: list[str] | None = None) -> A.Node:
        """Char-level language of the decoded string (before JSON encoding)."""
        langs: list[A.Node] = []
        mn = s.get("minLength", 0)
        mx = s.get("maxLength")
        for k, v in (("minLength", mn), ("maxLength", mx)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                if isinstance(v, float) and v.is_integer() and v >= 0:
                    continue
                raise InvalidSchemaError(f"{k} at {path} must be a non-negative integer")
        mn = int(mn)
        if mx is not None:
            mx = int(mx)
            if mx < mn:
                self.unsat.append(f"minLength {mn} > maxLength {mx} at {path}")
                return A.NOTHING
            mx = min(mx, max(self.opts.max_string_unroll, mn))
        patterns = list(s.get("__patterns__", []))
        if "pattern" in s:
            patterns.append(s["pattern"])
        for p in patterns:
            if not isinstance(p, str):
                raise InvalidSchemaError(f"pattern at {path} must be a string")
            try:
                # matched under every reading (Python's `re` and ECMA-262)
                langs.append(search_language(parse_regex(p, "all")))
            except InvalidRegexError as e:
                raise UnsupportedSchemaError("pattern", path, str(e)) from None
        fmts = []
        fmt_nodes: list[A.Node] = []
        if "format" in s:
            fmts.append(s["format"])
        fmts.extend(s.get("__formats__", []))
        for f in fmts:
            if not isinstance(f, str):
                raise InvalidSchemaError(f"format at {path} must be a string")
            fnode = format_node(f)
            if fnode is None:
                if f in STANDARD_FORMATS:
                    raise UnsupportedSchemaError("format", path, f"format {f!r} is not supported")
                continue  # not a standard format: an annotation
            fmt_nodes.append(fnode)
        if fmt_nodes and (mn > 0 or mx is not None):
            # a format with length bounds: the format DFA times a counter, built directly (cheap), or the
            # format capped to the maximum length when even that is too large (a sound narrowing)
            try:
                fnode = fmt_nodes[0] if len(fmt_nodes) == 1 else \
                    dfa_ops.intersect(fmt_nodes, self.deadline, self.opts.intersection_limit)
                fmt_nodes = [with_length(fnode, mn, mx, self.deadline, self.opts.intersection_limit)]
                mn, mx = 0, None
            except (dfa_ops.TooLarge, FormatLengthTooLarge):
                raise UnsupportedSchemaError("format", path, "combination with length bounds is too large") from None
        langs.extend(fmt_nodes)
        if mn > 0 or mx is not None:
            langs.append(A.rep(A.chars(A.ANY_CHAR), mn, mx))
        if not langs:
            node = A.star(A.chars(A.ANY_CHAR))
        elif len(langs) == 1:
            node = langs[0]
        else:
            try:
                node = dfa_ops.intersect(langs, self.deadline, self.opts.intersection_limit)
            except dfa_ops.TooLarge:
                raise UnsupportedSchemaError("pattern" if patterns else "format", path,
                                             "combination with length bounds is too large") from None
        if excluded:
            node = self._difference(node, [A.lit(x) for x in excluded], "not", path)
        return node

    def _string(self, s: dict, path: str, excluded: list[str] | None = None) -> A.Node:
        body = self.string_body_chars(s, path, excluded)
        if A.is_nothing(body):
            return A.NOTHING
        return A.seq(A.lit('"'), json_encode_string_body(body, self._enc_memo), A.lit('"'))

    # -------------------------------------------------------------- arrays
    def _array(self, s: dict, path: str) -> A.Node:
        prefix = s.get("prefixItems", [])
        if not isinstance(prefix, list):
            raise InvalidSchemaError(f"prefixItems at {path} must be an array")
        rest = s.get("items", True)
        if "items" not in s and s.get("unevaluatedItems", True) not in (True, {}):
            # without applicators or `contains`, the items no keyword evaluates are those after the prefix
            if len(s.get("__conj__", [])) > 1 or "contains" in s:
                raise UnsupportedSchemaError("unevaluatedItems", path, "combined with applicators or contains")
            rest = s["unevaluatedItems"]
        mn = int(s.get("minItems", 0) or 0)
        mx = s.get("maxItems")
        if mx is not None:
            mx = int(mx)
            if mx < mn:
                self.unsat.append(f"minItems {mn} > maxItems {mx} at {path}")
                return A.NOTHING
        unique = bool(s.get("uniqueItems", False))
        ws = self.ws
        comma = A.seq(ws, A.lit(","), ws)
        contains = self._contains_counter(s, path)
        if contains is not None and contains[2] is not None and contains[2] < contains[1]:
            self.unsat.append(f"minContains > maxContains at {path}")
            return A.NOTHING
        if unique and contains is not None:
            raise UnsupportedSchemaError("contains", path, "together with uniqueItems")
        if unique:
            if self.opts.unique_items == "error":
                raise UnsupportedSchemaError("uniqueItems", path)
            res = self._unique_array(s, prefix, rest, mn, mx, path)
            if res is not None:
                return res
        if mx is not None:
            mx = min(mx, max(self.opts.max_items_unroll, mn, len(prefix) if mx >= len(prefix) else mx))
        K = mx if mx is not None else max(len(prefix), mn, 1)
        if contains is None:
            item_nodes = [self.compile(p, f"{path}/prefixItems/{i}") for i, p in enumerate(prefix)]
            rest_node = self.compile(rest, f"{path}/items")
            edges = []
            for k in range(K):
                it = item_nodes[k] if k < len(item_nodes) else rest_node
                if A.is_nothing(it):
                    continue
                edges.append((k, it if k == 0 else A.seq(comma, it), k + 1))
            if mx is None and not A.is_nothing(rest_node) and K >= len(item_nodes):
                edges.append((K, A.seq(comma, rest_node), K))
            finals = tuple(k for k in range(mn, K + 1))
            body = A.Graph(K + 1, 0, finals, tuple(edges))
            return A.seq(A.lit("["), ws, body, ws, A.lit("]"))
        # contains: states (index k, count c of items matching `contains`, capped at C)
        cond, lo_c, hi_c = contains
        C = lo_c if hi_c is None else hi_c

        def item_langs(sch: Any, where: str) -> tuple[A.Node, A.Node]:
            """(items matching `contains`, items that do not count). Without maxContains an item may
            match and not be counted (the count is a lower bound), so the second is every item."""
            hit = self.compile({"allOf": [sch, cond]}, where)
            if hi_c is None:
                return hit, self.compile(sch, where)
            try:
                return hit, self.compile({"allOf": [sch, {"not": cond}]}, where)
            except UnsupportedSchemaError as e:
                raise UnsupportedSchemaError("maxContains", path, f"needs the negation of `contains`: {e}") from None

        langs = [item_langs(p, f"{path}/prefixItems/{i}") for i, p in enumerate(prefix)]
        rest_langs = item_langs(rest, f"{path}/items")
        nid = lambda k, c: k * (C + 1) + c  # noqa: E731
        edges = []
        for k in range(K + 1):
            if k == K and (mx is not None or K < len(langs)):
                break
            hit, miss = langs[k] if k < len(langs) else rest_langs
            k2 = min(k + 1, K)
            for c in range(C + 1):
                for lab, c2 in ((hit, c + 1 if hi_c is not None else min(c + 1, C)), (miss, c)):
                    if c2 <= C and not A.is_nothing(lab):
                        edges.append((nid(k, c), lab if k == 0 else A.seq(comma, lab), nid(k2, c2)))
        finals = tuple(nid(k, c) for k in range(mn, K + 1) for c in range(lo_c, C + 1))
        body = A.Graph((K + 1) * (C + 1), 0, finals, tuple(edges))
        return A.seq(A.lit("["), ws, body, ws, A.lit("]"))

    def _contains_counter(self, s: dict, path: str) -> tuple[Any, int, int | None] | None:
        """(contains schema, minContains, maxContains or None) when `contains` constrains the array."""
        if "contains" not in s:
            return None
        lo = s.get("minContains", 1)
        hi = s.get("maxContains")
        for k, v in (("minContains", lo), ("maxContains", hi)):
            if v is not None and (isinstance(v, bool) or not is_number(v) or v < 0 or int(v) != v):
                raise InvalidSchemaError(f"{k} at {path} must be a non-negative integer")
        lo, hi = int(lo), None if hi is None else int(hi)
        if lo == 0 and hi is None:
            return None  # always satisfied
        if max(lo, hi or 0) > self.opts.max_items_unroll:
            raise UnsupportedSchemaError("minContains" if hi is None else "maxContains", path,
                                         f"counts above max_items_unroll ({self.opts.max_items_unroll})")
        return s["contains"], lo, hi

    def _unique_array(self, s, prefix, rest, mn, mx, path) -> A.Node | None:
        ws = self.ws
        comma = A.seq(ws, A.lit(","), ws)
        if not prefix:
            dom = self._finite_domain(rest, path)
            if dom is not None and len(dom) <= 16:
                # distinct values in any order: the domain's values as object-member-like entries
                items = object_members([(v, False) for v in dom], [], comma, mn, mx, path)
                return A.seq(A.lit("["), ws, items, ws, A.lit("]"))
            strings = self._distinct_first_char_strings(rest, path)
            if strings is not None and mn <= len(strings):
                # strings that start with different characters are different: each first-character class
                # at most once, in any order (a sound narrowing of uniqueItems)
                items = object_members([(v, False) for v in strings], [], comma, mn, mx, path)
                return A.seq(A.lit("["), ws, items, ws, A.lit("]"))
        # otherwise: at most one item (every such array is unique)
        if mn > 1:
            raise UnsupportedSchemaError("uniqueItems", path, "with minItems > 1 over a non-finite item domain")
        first = self.compile(prefix[0] if prefix else rest, f"{path}/items")
        lim = 1 if mx is None else min(1, mx)
        if lim == 0 or A.is_nothing(first):
            return A.seq(A.lit("["), ws, A.lit("]")) if mn == 0 else A.NOTHING
        one = A.seq(A.lit("["), ws, first, ws, A.lit("]"))
        if mn == 0:
            return A.alt(A.seq(A.lit("["), ws, A.lit("]")), one)
        return one

    def _distinct_first_char_strings(self, sch, path) -> list[A.Node] | None:
        """For a string-only item schema: its strings split by first character (each printable ASCII one,
        every other character, the empty string), the classes that have strings; None for other items."""
        x, ent = self._deref(sch, path)
        try:
            if not (isinstance(x, dict) and x.get("type") == "string"
                    and set(x) - ANNOTATIONS <= {"type", "minLength", "maxLength", "pattern", "format"}):
                return None
        finally:
            for r in ent:
                self._leave(r)
        classes = [re.escape(chr(c)) for c in range(0x20, 0x7F)] + ["[^\\x20-\\x7e]"]
        out = [self.compile({"allOf": [sch, {"pattern": f"^{c}"}]}, f"{path}/items") for c in classes]
        out.append(self.compile({"allOf": [sch, {"maxLength": 0}]}, f"{path}/items"))
        return [n for n in out if not A.is_nothing(n)]

    def _finite_domain(self, sch, path) -> list[A.Node] | None:
        x, ent = self._deref(sch, path)
        try:
            if isinstance(x, dict):
                if "enum" in x or "const" in x:
                    vals = x.get("enum", [x.get("const")]) if "enum" in x else [x["const"]]
                    keep = [v for v in vals if self.is_valid(v, x)]
                    out = []
                    seen = []
                    for v in keep:
                        if any(json_eq(v, w) for w in seen):
                            continue
                        seen.append(v)
                        out.append(json_literal(v))
                    return out
                if x.get("type") == "boolean" and set(x) - ANNOTATIONS <= {"type"}:
                    return [A.lit("false"), A.lit("true")]
            return None
        finally:
            for r in ent:
                self._leave(r)

    # -------------------------------------------------------------- objects
    def _object(self, s: dict, path: str) -> A.Node:
        """An object schema. The strict narrowings (`additional_properties="forbid"` where the schema is
        silent, `additional_names="nonempty"`) never make a satisfiable object empty: required names that no
        `properties`/`patternProperties` declares keep free-form values, and an object the narrowings leave
        empty is compiled again with undeclared properties allowed (`spec=1`), then also named "" (`spec=2`),
        as the specification allows."""
        node = self._object_members(s, path, 0)
        if A.is_nothing(node) and self.opts.additional_properties == "forbid" and "additionalProperties" not in s:
            node = self._object_members(s, path, 1)
        if A.is_nothing(node) and self.opts.additional_names == "nonempty":
            node = self._object_members(s, path, 2)
        return node

    def _object_members(self, s: dict, path: str, spec: int) -> A.Node:
        ws = self.ws
        props = s.get("properties", {}) or {}
        if not isinstance(props, dict):
            raise InvalidSchemaError(f"properties at {path} must be an object")
        required = s.get("required", []) or []
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise InvalidSchemaError(f"required at {path} must be an array of strings")
        pats = s.get("patternProperties", {}) or {}
        if not isinstance(pats, dict):
            raise InvalidSchemaError(f"patternProperties at {path} must be an object")
        if "additionalProperties" in s:
            addl = s["additionalProperties"]
        elif "unevaluatedProperties" in s and s["unevaluatedProperties"] not in (True, {}):
            addl = s["unevaluatedProperties"]
            if len(s.get("__conj__", [])) > 1 and not s.get("__unevaluated_root__"):
                raise UnsupportedSchemaError("unevaluatedProperties", path, "combined with applicators")
        else:
            addl = True if self.opts.additional_properties == "allow" or spec else False
        # under the narrowing, a required name nothing declares still takes any value (as in the spec)
        undeclared_value = True if addl is False and "additionalProperties" not in s \
            and "unevaluatedProperties" not in s else addl
        if addl == {} or addl is None:
            addl = True
        pnames = s.get("propertyNames")
        mnp = int(s.get("minProperties", 0) or 0)
        mxp = s.get("maxProperties")
        mxp = None if mxp is None else int(mxp)
        if mxp is not None and mnp > mxp:
            self.unsat.append(f"minProperties {mnp} > maxProperties {mxp} at {path}")
            return A.NOTHING
        deps = {}
        if "dependentRequired" in s:
            deps.update(s["dependentRequired"])
        if "dependencies" in s:
            for k, v in s["dependencies"].items():
                if isinstance(v, list):
                    deps[k] = v
                else:  # (schema dependencies are lowered to applicators before)
                    raise UnsupportedSchemaError("dependencies", path, "schema dependencies")
        for a, bs in deps.items():
            if not isinstance(bs, list) or not all(isinstance(b, str) for b in bs):
                raise InvalidSchemaError(f"dependentRequired at {path} must map names to arrays of names")
        req_set = _required_closure(required, deps)
        # dependencies (a present => b present). A name whose dependencies are not all required is "free":
        # with few free names the object is the exact union, over which free names are present, of objects
        # with those names (and their dependencies) required and the other free names absent; with more,
        # the free names are never generated (a sound narrowing)
        free = sorted(a for a, bs in deps.items() if a not in req_set and any(b not in req_set for b in bs))
        if free and not s.get("__dependencies_split__") and len(free) <= self.opts.max_dependency_branches:
            outs = []
            for mask in range(1 << len(free)):
                present = [a for i, a in enumerate(free) if mask >> i & 1]
                branch = dict(s, required=list(required) + present, __dependencies_split__=True)
                outs.append(self._object_members(branch, path, spec))
            return A.alt(*outs)
        forbidden = set(free)
        # declared properties (order: properties, then required-only names); forbidden names are listed so
        # that no additional key can spell them
        names = list(props.keys()) + [r for r in required if r not in props]
        for r in sorted(req_set) + free:
            if r not in names:
                names.append(r)
        entries = []  # (name, value node, required)
        for name in names:
            self.check_deadline()
            sub = props.get(name, None)
            conj = []
            if sub is not None:
                conj.append(sub)
            # a name matched by a pattern under some reading (Python `re`, ECMA-262) carries its schema;
            # one that some reading leaves unmatched also carries additionalProperties
            matched = [p for p in pats if pattern_matches(p, name, path, "any")]
            for p in matched:
                conj.append(pats[p])
            is_req = name in req_set
            if sub is None and not any(pattern_matches(p, name, path, "all") for p in matched):
                conj.append(undeclared_value if is_req else addl)
            if name in forbidden and not is_req:
                continue
            if pnames is not None and not self._name_ok(name, pnames, path):
                if is_req:
                    return A.NOTHING
                continue
            if len(conj) == 1:
                vnode = self.compile(conj[0], f"{path}/properties/{name}")
            else:
                vnode = self.compile({"allOf": conj}, f"{path}/properties/{name}")
            if A.is_nothing(vnode):
                if is_req:
                    return A.NOTHING
                continue
            key = A.lit(json.dumps(name, ensure_ascii=False))
            entries.append((A.seq(key, ws, A.lit(":"), ws, vnode), is_req))
        # additional keys
        extra = self._extra_entries(names, pats, addl, pnames, path, nonempty_names=spec < 2)
        # declared properties in any order, each at most once (a lazily expanded subset automaton)
        members = object_members(entries, extra, A.seq(ws, A.lit(","), ws), mnp, mxp, path,
                                 ordered=self.opts.property_order == "declared",
                                 interleave_max=self.opts.interleave_additional_max)
        if A.is_nothing(members):
            return A.NOTHING
        return A.seq(A.lit("{"), ws, members, ws, A.lit("}"))

    def _name_ok(self, name: str, pnames: Any, path: str) -> bool:
        return self.is_valid(name, pnames)

    def _extra_entries(self, names: list[str], pats: dict, addl: Any, pnames: Any, path: str,
                       nonempty_names: bool = True) -> list[A.Node]:
        """Key/value alternatives for properties beyond the declared ones (one per key class)."""
        ws = self.ws
        if self.opts.additional_names == "nonempty" and nonempty_names:
            names = names + [""]  # (a sound narrowing: excluded like a declared name)
        out = []
        declared = A.alt_literals([json.dumps(n, ensure_ascii=False)[1:-1] for n in names]) if names else A.NOTHING
        if not pats and pname_lang_is_trivial(pnames):
            # the common case: any key except the declared names (a trie complement, no product needed)
            if addl is False:
                return []
            vnode = self.compile(addl, f"{path}/additionalProperties")
            if A.is_nothing(vnode):
                return []
            key_body = json_encode_string_body(strings_except(names), self._enc_memo)
            return [A.seq(A.lit('"'), key_body, A.lit('"'), ws, A.lit(":"), ws, vnode)]
        pname_lang = None
        if pnames is not None and pnames is not True:
            pname_lang = self._property_names_language(pnames, path)
        # a key is classified only where every reading agrees: "matches P" is taken in the narrowest
        # reading (matched by Python's `re` and ECMA-262 alike), "does not match P" as the complement of
        # the widest (Unicode \d \w, `$` before a final newline, ...)
        pat_langs = []  # (narrowest, widest)
        for p in pats:
            try:
                pat_langs.append(tuple(json_encode_string_body(search_language(parse_regex(p, r)))
                                       for r in ("all", "any")))
            except InvalidRegexError as e:
                raise UnsupportedSchemaError("patternProperties", path, str(e)) from None
        if len(pat_langs) > 4:
            # classifying keys against many patterns needs large product automata: generate no
            # undeclared keys at all (a sound narrowing: the declared properties carry their schemas)
            return []
        classes = []  # (key body languages, languages it must avoid, value schema, required to fit)
        # a key matching exactly the patterns of a subset S: the value satisfies every schema of S
        pat_list = list(pats)
        for mask in range(1, 1 << len(pat_list)):
            inside = [i for i in range(len(pat_list)) if mask >> i & 1]
            others = [pat_langs[j][1] for j in range(len(pat_list)) if not mask >> j & 1]
            vs = pats[pat_list[inside[0]]] if len(inside) == 1 else {"allOf": [pats[pat_list[i]] for i in inside]}
            classes.append(([pat_langs[i][0] for i in inside], others + [declared], vs, len(inside) == 1))
        if addl is not False:
            classes.append(([ANY_STRING_BODY], [w for _, w in pat_langs] + [declared], addl, True))
        for pos, negs, vs, needed in classes:
            if pname_lang is not None:
                pos = pos + [pname_lang]
            negs = [n for n in negs if not A.is_nothing(n)]
            try:
                if negs or len(pos) > 1:
                    limit = self.opts.intersection_limit if needed else self.opts.intersection_limit // 10
                    key_body = dfa_ops.product(pos + negs, [False] * len(pos) + [True] * len(negs), self.deadline,
                                               limit)
                else:
                    key_body = pos[0]
            except dfa_ops.TooLarge:
                if not needed:
                    continue  # keys matching several patterns are not generated (a sound narrowing)
                raise UnsupportedSchemaError("patternProperties" if pats else "additionalProperties", path,
                                             "key language too large") from None
            if A.is_nothing(key_body):
                continue
            vnode = self.compile(vs, f"{path}/additionalProperties")
            if A.is_nothing(vnode):
                continue
            out.append(A.seq(A.lit('"'), key_body, A.lit('"'), ws, A.lit(":"), ws, vnode))
        return out

    def _property_names_language(self, pn: Any, path: str) -> A.Node:
        x, ent = self._deref(pn, path)
        try:
            if x is False:
                return A.NOTHING
            if not isinstance(x, dict):
                raise UnsupportedSchemaError("propertyNames", path)
            kws = {k for k in x if k not in ANNOTATIONS}
            if "enum" in kws or "const" in kws:
                vals = x.get("enum", [x.get("const")]) if "enum" in x else [x["const"]]
                strs = [v for v in vals if isinstance(v, str) and self.is_valid(v, x)]
                return A.alt_literals([json.dumps(v, ensure_ascii=False)[1:-1] for v in strs]) if strs else A.NOTHING
            if kws - {"type", "pattern", "minLength", "maxLength", "format"}:
                raise UnsupportedSchemaError("propertyNames", path, f"keywords {sorted(kws)}")
            if "type" in x and x["type"] != "string":
                return A.NOTHING
            return json_encode_string_body(self.string_body_chars(x, path + "/propertyNames"))
        finally:
            for r in ent:
                self._leave(r)

    # -------------------------------------------------------------- any value
    def any_value(self, depth: int) -> A.Node:
        hit = self._any_cache.get(depth)
        if hit is not None:
            return hit
        ws = self.ws
        comma = A.seq(ws, A.lit(","), ws)
        string = A.seq(A.lit('"'), ANY_STRING_BODY, A.lit('"'))
        scalars = [A.lit("null"), A.lit("true"), A.lit("false"), N.JSON_NUMBER, string]
        if depth <= 0:
            node = A.alt(*scalars, A.seq(A.lit("["), ws, A.lit("]")), A.seq(A.lit("{"), ws, A.lit("}")))
        else:
            inner = self.any_value(depth - 1)
            arr = A.seq(A.lit("["), ws, A.opt(A.seq(inner, A.star(A.seq(comma, inner)))), ws, A.lit("]"))
            kv = A.seq(string, ws, A.lit(":"), ws, inner)
            obj = A.seq(A.lit("{"), ws, A.opt(A.seq(kv, A.star(A.seq(comma, kv)))), ws, A.lit("}"))
            node = A.alt(*scalars, arr, obj)
        self._any_cache[depth] = node
        return node


def _required_closure(required: list[str], deps: dict[str, list[str]]) -> set[str]:
    """The required names plus, transitively, the names they depend on."""
    out = set(required)
    todo = list(out)
    while todo:
        for b in deps.get(todo.pop(), []):
            if b not in out:
                out.add(b)
                todo.append(b)
    return out


def pname_lang_is_trivial(pnames) -> bool:
    return pnames is None or pnames is True or pnames == {}


def schema_to_regex_ast(schema: Any, opts: SchemaOptions | None = None, deadline: Deadline | None = None,
                        ignored: list | None = None) -> A.Node:
    """Compile a JSON Schema to the regex AST of its (narrowed) JSON texts. Keywords outside the JSON Schema
    vocabularies are appended to `ignored` as (JSON pointer, keyword) and, by `opts.unknown_keywords`,
    warned about (UnknownKeywordWarning), refused (UnknownKeywordError) or only listed."""
    opts = opts or SchemaOptions()
    try:
        sc = SchemaCompiler(schema, opts, deadline)
        unknown = sc.unknown_keywords()
        if unknown:
            if opts.unknown_keywords == "error":
                path, kw = unknown[0]
                raise UnknownKeywordError(kw, path, "unknown keyword, not enforced (unknown_keywords='error'); "
                                          f"all: {', '.join(f'{k!r} at {p}' for p, k in unknown)}")
            if opts.unknown_keywords == "warn":
                warnings.warn("JSON Schema keyword(s) not enforced (outside the JSON Schema vocabularies): "
                              + ", ".join(f"{k!r} at {p}" for p, k in unknown)
                              + "; pass unknown_keywords='error' to refuse them or 'ignore' to silence this",
                              UnknownKeywordWarning, stacklevel=2)
            if ignored is not None:
                ignored.extend(unknown)
        node = sc.compile_root()
    except RecursionError:
        raise UnsupportedSchemaError("$ref", "#", "schema nesting too deep") from None
    if A.is_nothing(node):
        why = "; ".join(dict.fromkeys(sc.unsat)) or "no JSON value satisfies the schema"
        spec = without_narrowings(opts)
        if spec != opts:
            # never call a schema unsatisfiable because of a narrowing: say which it is
            try:
                spec_node = SchemaCompiler(schema, spec, deadline).compile_root()
            except (UnsupportedSchemaError, RecursionError):
                spec_node = A.NOTHING
            if not A.is_nothing(spec_node):
                changed = [f"{f.name}={getattr(opts, f.name)!r}" for f in fields(opts)
                           if getattr(opts, f.name) != getattr(spec, f.name)]
                raise UnsatisfiableSchemaError(
                    f"the narrowing options ({', '.join(changed)}) leave no output for this schema, which is "
                    f"satisfiable under the specification's semantics; pass strict=False ({why})")
        raise UnsatisfiableSchemaError(why)
    return node

