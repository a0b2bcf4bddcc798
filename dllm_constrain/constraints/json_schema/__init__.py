"""JSON Schema -> regular language of JSON texts (a regex AST), our own compiler.

Never under-constrain: every text of the language validates against the schema (jsonschema, format assertion);
where the exact language is not regular or not implemented it is narrowed soundly or refused with
UnsupportedSchemaError naming the keyword (docs/constraints.md, "JSON Schema support" and "Sound narrowings").
Keywords outside the vocabularies (x-*, "nullable", typos) are reported, or refused under unknown_keywords="error".

Layout (a schema flows top to bottom; no module below `compiler` imports it, each receives the compiler as
a `context.LoweringContext`):
* options, inputs: SchemaOptions; the forms a schema may be given in, and NormalizedSchema (read once);
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
