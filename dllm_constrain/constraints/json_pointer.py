"""Where in a JSON document a partial text is writing: the location named in constraint timeout messages."""
from __future__ import annotations


def json_pointer_of_prefix(text: str) -> str:
    """The JSON pointer (RFC 6901) of the value a partial JSON text is writing at its end, e.g. '{"a":[1,{"b":'
    -> '/a/1/b' (best effort, for messages: a key being written counts as its member's location)."""
    stack: list[list] = []  # ["o", key or None] / ["a", index]
    i, n = 0, len(text)
    expect_key = False
    while i < n:
        ch = text[i]
        if ch == '"':
            j = i + 1
            buf = []
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n:
                    buf.append(text[j + 1])
                    j += 2
                    continue
                buf.append(text[j])
                j += 1
            if expect_key and stack and stack[-1][0] == "o":
                stack[-1][1] = "".join(buf)
            i = j + 1
            continue
        if ch == "{":
            stack.append(["o", None])
            expect_key = True
        elif ch == "[":
            stack.append(["a", 0])
            expect_key = False
        elif ch in "}]":
            if stack:
                stack.pop()
            expect_key = False
        elif ch == ":":
            expect_key = False
        elif ch == ",":
            if stack and stack[-1][0] == "a":
                stack[-1][1] += 1
            elif stack:
                stack[-1][1] = None
                expect_key = True
        i += 1
    parts = [str(x[1]) for x in stack if x[1] is not None]
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)
