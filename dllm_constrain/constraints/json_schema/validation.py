"""Instance validation against (parts of) the schema being compiled: the compiler keeps enum/const values,
declared names and oneOf branches only where a validator (jsonschema, with format assertion, `pattern`
matched under every regex reading) accepts them."""
from __future__ import annotations

from typing import Any

from ...errors import InvalidSchemaError, UnsupportedSchemaError
from .keywords import VALIDATED, type_set
from .patterns import all_readings_pattern
from .values import canon, json_eq, type_of


class InstanceValidator:
    """jsonschema's validator for the root's draft, built on first use, evolved to any subschema."""

    def __init__(self, root: Any):
        self.root = root
        self._validator = None
        self._enum_sets: dict = {}

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

    def is_valid(self, instance: Any, schema: Any) -> bool:
        try:
            return self.validator().evolve(schema=schema).is_valid(instance)
        except UnsupportedSchemaError:
            raise
        except Exception as e:
            raise UnsupportedSchemaError("enum", "#", f"cannot validate enum values: {type(e).__name__}: {e}") from None

    def is_valid_fast(self, v: Any, c: Any) -> bool:
        """is_valid, with a fast path for conjuncts that only restrict the type / enumerate values (keywords a
        validator ignores, such as annotations and extensions, do not leave it: jsonschema checks every enum
        member against the whole enum, quadratic in its size)."""
        if isinstance(c, dict):
            kws = {k for k in c if k in VALIDATED}
            if kws <= {"type", "enum", "const"}:
                if "type" in c:
                    ts = type_set(c["type"], "#")
                    tv = type_of(v)
                    if not (tv in ts or (tv == "integer" and "number" in ts)):
                        return False
                if "const" in c and not json_eq(v, c["const"]):
                    return False
                if "enum" in c and canon(v) not in self._enum_keys(c):
                    return False
                return True
        return self.is_valid(v, c)

    def _enum_keys(self, c: dict) -> set[str]:
        cache = self._enum_sets.get(id(c))
        if cache is None or cache[0] is not c:
            cache = (c, {canon(x) for x in c["enum"]} if isinstance(c["enum"], list) else set())
            self._enum_sets[id(c)] = cache
        return cache[1]
