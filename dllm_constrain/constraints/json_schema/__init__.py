"""JSON Schema -> regular language of JSON texts (a regex AST), our own compiler.

Principle: never under-constrain. Every text in the produced language is a JSON document that validates
against the schema (jsonschema, with format assertion). Where the exact language is not regular or not
implemented, we either narrow it soundly (documented below and in docs/constraints.md) or refuse with
UnsupportedSchemaError naming the keyword. Keywords outside the JSON Schema vocabularies (x-*, "nullable",
typos) are not enforced: each is reported (UnknownKeywordWarning and `ignored_keywords`), or refused
with UnknownKeywordError under `unknown_keywords="error"`.

Sound narrowings (outputs stay valid; some valid instances are not producible):
* whitespace: none between tokens by default ("compact"); "flexible" allows up to N whitespace chars;
* object properties appear in any order, each declared one at most once; additional properties (when
  allowed) stand anywhere among them in objects with at most `interleave_additional_max` (32) declared
  properties, after all declared ones in larger objects; `property_order="declared"` narrows to the
  declared order;
* no exponent notation for bounded numbers; integers without "-0", and with a zero fraction ("1.0") only
  where a validator's float reading of it is exact;
* strings use the canonical JSON escapes only (what json.dumps(ensure_ascii=False) writes);
* recursion through $ref is unrolled to `max_recursion_depth` levels; free-form values (`true`/`{}`
  schemas, undeclared properties) are nested at most `any_json_depth` levels;
* maxLength / maxItems above `max_string_unroll` / `max_items_unroll` are lowered to those caps;
* `uniqueItems: true`: over a small finite item domain, distinct values in any order (exact); string items
  with distinct first characters; otherwise arrays of at most one item;
* `oneOf`: each branch is narrowed to the JSON types where it is provably disjoint from the others, and may
  forbid a property another branch requires;
* optional `dependentRequired` names beyond `max_dependency_branches` are never generated;
* a property matching several `patternProperties` patterns is generated only when its key class is small;
* patterns are read by Python's `re` and by ECMA-262 alike: strings match under every reading, keys whose
  classification differs between the readings are not generated;
* numbers near a strict bound (or any bound beyond 2**53) or near an excluded number, within the rounding
  margin of a double (numeric.float_margin), are not generated.

Layout (a schema flows top to bottom; no module below `compiler` imports it, each receives the compiler as
a `context.LoweringContext`):
* options, inputs: SchemaOptions; the forms a schema may be given in;
* keywords, unknown: the vocabulary (types, annotations, refused keywords); keywords outside it;
* refs, validation: $ref / $id / $anchor resolution and recursion counts; instance checks by jsonschema;
* ir, algebra, oneof: the typed intermediate form (Conjunction, Negation, Exclusion), the merge of a
  conjunction, `not` as a positive schema, oneOf branches made disjoint;
* applicators: $ref, dependentSchemas, allOf/anyOf/oneOf/not/if distributed into conjunctions;
* lower_scalars, lower_strings, lower_arrays, lower_objects: a Conjunction's language per JSON type
  (json_text and patterns serve them);
* compiler: SchemaCompiler (memo, per-type dispatch) and schema_to_regex_ast.
"""
from .compiler import SchemaCompiler, schema_to_regex_ast
from .inputs import NormalizedSchema, normalize_schema, normalize_schema_input
from .json_text import ANY_STRING_BODY, json_encode_string_body, json_literal, strings_except
from .options import SchemaOptions

__all__ = ["ANY_STRING_BODY", "NormalizedSchema", "SchemaCompiler", "SchemaOptions", "json_encode_string_body",
           "json_literal", "normalize_schema", "normalize_schema_input", "schema_to_regex_ast", "strings_except"]
