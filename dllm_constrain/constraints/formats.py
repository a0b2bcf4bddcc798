"""String `format`s as regular languages (over characters, before JSON string encoding).

Each language is a subset of what the format's standard allows and of what jsonschema's FormatChecker
accepts (so every generated value passes validation); e.g. dates are exact including leap years,
date-time uses an upper-case `T`/`Z`, seconds 00-59.

Standard formats that are not regular or not implemented (idn-hostname) are refused. Formats outside the
JSON Schema specification (e.g. "int32", "phone") carry no validation semantics and are ignored.
"""
from __future__ import annotations

import functools

from . import regex_ast as A
from .regex_parser import parse_regex

_YEAR = r"(?:000[1-9]|00[1-9]\d|0[1-9]\d\d|[1-9]\d{3})"
_MD = r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)|02-(?:0[1-9]|1\d|2[0-8]))"
_LEAP_YEAR = r"(?:\d\d(?:[02468][48]|[13579][26]|[2468]0)|(?:[02468][48]|[13579][26]|[2468]0)00)"
DATE = rf"(?:{_YEAR}-{_MD}|{_LEAP_YEAR}-02-29)"
TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
DATE_TIME = rf"{DATE}T{TIME}"
EMAIL = r"[A-Za-z0-9](?:[A-Za-z0-9._%+-]{0,62}[A-Za-z0-9])?@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+"
UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_OCT = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
IPV4 = rf"{_OCT}(?:\.{_OCT}){{3}}"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,60}[A-Za-z0-9])?"
HOSTNAME = rf"{_LABEL}(?:\.{_LABEL}){{0,3}}"

# RFC 3986 pieces
_UNRES = r"A-Za-z0-9._~\-"
_SUB = r"!$&'()*+,;="
_PCT = r"%[0-9A-Fa-f]{2}"
_PCHAR = rf"(?:[{_UNRES}{_SUB}:@]|{_PCT})"
_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]*"
_AUTH = rf"(?:(?:[{_UNRES}{_SUB}:]|{_PCT})*@)?(?:[{_UNRES}{_SUB}]|{_PCT})*(?::\d*)?"
_PATH_ABEMPTY = rf"(?:/{_PCHAR}*)*"
_PATH_ABS = rf"/(?:{_PCHAR}+(?:/{_PCHAR}*)*)?"
_PATH_ROOTLESS = rf"{_PCHAR}+(?:/{_PCHAR}*)*"
_SEG_NZ_NC = rf"(?:[{_UNRES}{_SUB}@]|{_PCT})+"
_PATH_NOSCHEME = rf"{_SEG_NZ_NC}(?:/{_PCHAR}*)*"
_QUERY = rf"(?:\?(?:{_PCHAR}|[/?])*)?"
_FRAG = rf"(?:#(?:{_PCHAR}|[/?])*)?"
URI = rf"{_SCHEME}:(?://{_AUTH}{_PATH_ABEMPTY}|{_PATH_ABS}|{_PATH_ROOTLESS})?{_QUERY}{_FRAG}"
_RELATIVE = rf"(?://{_AUTH}{_PATH_ABEMPTY}|{_PATH_ABS}|{_PATH_NOSCHEME})?{_QUERY}{_FRAG}"
URI_REFERENCE = rf"(?:{URI}|{_RELATIVE})"
JSON_POINTER = r"(?:/(?:[^/~]|~[01])*)*"
RELATIVE_JSON_POINTER = rf"(?:0|[1-9]\d*)(?:#|{JSON_POINTER})"
_DUR_TIME = r"T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S)"
DURATION = rf"P(?:(?:\d+D|\d+M(?:\d+D)?|\d+Y(?:\d+M(?:\d+D)?)?)(?:{_DUR_TIME})?|{_DUR_TIME}|\d+W)"
REGEX = r"[A-Za-z0-9 _]*"  # a sound subset: every such string is a valid regex


def _ipv6() -> str:
    h = r"[0-9A-Fa-f]{1,4}"
    ls32 = rf"(?:{h}:{h}|{IPV4})"
    forms = [
        rf"(?:{h}:){{6}}{ls32}",
        rf"::(?:{h}:){{5}}{ls32}",
        rf"(?:{h})?::(?:{h}:){{4}}{ls32}",
        rf"(?:(?:{h}:){{0,1}}{h})?::(?:{h}:){{3}}{ls32}",
        rf"(?:(?:{h}:){{0,2}}{h})?::(?:{h}:){{2}}{ls32}",
        rf"(?:(?:{h}:){{0,3}}{h})?::{h}:{ls32}",
        rf"(?:(?:{h}:){{0,4}}{h})?::{ls32}",
        rf"(?:(?:{h}:){{0,5}}{h})?::{h}",
        rf"(?:(?:{h}:){{0,6}}{h})?::",
    ]
    return "(?:" + "|".join(forms) + ")"


IPV6 = _ipv6()

FORMATS: dict[str, str] = {
    "date": DATE,
    "time": TIME,
    "date-time": DATE_TIME,
    "email": EMAIL,
    "idn-email": EMAIL,
    "uuid": UUID,
    "uri": URI,
    "iri": URI,
    "uri-reference": URI_REFERENCE,
    "iri-reference": URI_REFERENCE,
    "uri-template": URI,  # a URI without braces is a valid template
    "hostname": HOSTNAME,
    "ipv4": IPV4,
    "ipv6": IPV6,
    "json-pointer": JSON_POINTER,
    "relative-json-pointer": RELATIVE_JSON_POINTER,
    "duration": DURATION,
    "regex": REGEX,
}

# formats defined by the JSON Schema specification (2020-12 and earlier drafts)
STANDARD_FORMATS = frozenset({
    "date", "time", "date-time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4", "ipv6",
    "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer",
    "relative-json-pointer", "regex",
})


@functools.lru_cache(maxsize=None)
def format_node(name: str) -> A.Node | None:
    """Char-level language for a supported format, or None if the format is not supported."""
    pat = FORMATS.get(name)
    if pat is None:
        return None
    return parse_regex(pat).node
