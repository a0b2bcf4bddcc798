"""Plain-text tasks behind the shipped grammar and regex demos: arithmetic with its result, arithmetic
expressions, short SQL over a named table, CSV rows from stated values, and small copy tasks.

Each task returns (request, answer); the answers are what the matching constraint accepts (`[0-9]+\\.` for a
result, grammars/arithmetic.lark, grammars/sql.lark, the csv grammar), so a constrained demo and an
unconstrained one ask the model for the same kind of text.
"""
from __future__ import annotations

import random
from collections.abc import Callable

from dllm_constrain.train import values as V

OPS = {"plus": ("+", lambda a, b: a + b), "minus": ("-", lambda a, b: a - b), "times": ("*", lambda a, b: a * b)}
COLUMNS = ["name", "age", "city", "email", "id", "price", "status", "score", "country", "title", "year", "total",
           "created", "owner", "level", "amount"]
COMPARISONS = {"older than": (">", "age"), "younger than": ("<", "age"), "above": (">", None),
               "below": ("<", None), "at least": (">=", None), "at most": ("<=", None), "over": (">", None),
               "under": ("<", None)}


def arithmetic_result(rng: random.Random) -> tuple[str, str]:
    """'What is 3 plus 4?' -> '7.' (non-negative results: the demo's regex is [0-9]+\\.)."""
    op = rng.choice(list(OPS))
    hi = rng.choice([9, 9, 20, 99]) if op != "times" else rng.choice([9, 12])
    a, b = rng.randint(0, hi), rng.randint(0, hi)
    if op == "minus" and b > a:
        a, b = b, a
    symbol, fn = OPS[op]
    question = rng.choice([f"What is {a} {op} {b}?", f"Compute {a} {op} {b}.", f"{a} {op} {b} = ?",
                           f"What is {a} {symbol} {b}?", f"Calculate {a} {symbol} {b}."])
    return question, f"{fn(a, b)}."


def arithmetic_expression(rng: random.Random) -> tuple[str, str]:
    """'Write the expression: x times 3 plus 4' -> 'x * 3 + 4' (grammars/arithmetic.lark)."""
    n = rng.randint(2, 4)
    atoms = [str(rng.randint(0, 99)) if rng.random() < 0.6 else V.word(rng, 1, 1) for _ in range(n)]
    ops = [rng.choice(["plus", "minus", "times", "divided by"]) for _ in range(n - 1)]
    symbols = {"plus": "+", "minus": "-", "times": "*", "divided by": "/"}
    words = atoms[0] + "".join(f" {o} {a}" for o, a in zip(ops, atoms[1:]))
    expr = atoms[0] + "".join(f" {symbols[o]} {a}" for o, a in zip(ops, atoms[1:]))
    lead = rng.choice(["Write the expression:", "Expression for", "Write as a formula:", "Formula:"])
    return f"{lead} {words}.", expr


def sql_query(rng: random.Random) -> tuple[str, str]:
    """'List users older than 30' -> 'SELECT * FROM users WHERE age > 30;' and a few other shapes."""
    table = rng.choice(["users", "orders", "products", "people", "books", "employees", "customers", "cities"])
    if rng.random() < 0.5:
        table = _identifier(rng) + "s"
    shape = rng.randint(0, 4)
    if shape == 0:
        phrase, (op, col) = rng.choice(list(COMPARISONS.items()))
        col = col or rng.choice(["price", "score", "total", "amount", "year", _identifier(rng)])
        n = rng.randint(0, 999)
        noun = "" if col == "age" else f" with {col}"
        return f"List {table}{noun} {phrase} {n}", f"SELECT * FROM {table} WHERE {col} {op} {n};"
    if shape == 1:
        cols = rng.sample(COLUMNS, rng.randint(1, 3))
        return (f"Show the {' and '.join(cols)} of all {table}",
                f"SELECT {', '.join(cols)} FROM {table};")
    if shape == 2:
        return f"Count the {table}", f"SELECT COUNT(*) FROM {table};"
    if shape == 3:
        col, value = rng.choice(["city", "name", "status", "country", "owner"]), V.proper(rng)
        return f"Find {table} whose {col} is {value}", f"SELECT * FROM {table} WHERE {col} = '{value}';"
    col, n = rng.choice(COLUMNS), rng.randint(1, 50)
    direction = rng.choice(["highest", "lowest"])
    order = "DESC" if direction == "highest" else "ASC"
    return (f"Top {n} {table} by {direction} {col}", f"SELECT * FROM {table} ORDER BY {col} {order} LIMIT {n};")


SQL_RESERVED = {"select", "from", "where", "and", "or", "not", "in", "is", "null", "like", "between", "as", "on",
                "join", "inner", "left", "right", "group", "by", "having", "order", "asc", "desc", "limit", "offset",
                "distinct", "count", "sum", "avg", "min", "max"}


def _identifier(rng: random.Random) -> str:
    while True:
        name = V.word(rng, 1, 2)
        if name not in SQL_RESERVED and name.rstrip("s") not in SQL_RESERVED:
            return name


def _cell(rng: random.Random, column: str) -> str:
    if column in ("age", "score", "year", "id", "level"):
        return str(V.integer(rng, 0, 2100 if column == "year" else 999))
    if column in ("price", "total", "amount"):
        return str(V.number(rng, 0.0))
    if column == "email":
        return V.email(rng)
    if column == "name" or column == "owner":
        return V.person(rng)
    return V.proper(rng) if rng.random() < 0.7 else V.word(rng)


def csv_rows(rng: random.Random) -> tuple[str, str]:
    """CSV from stated values ('Write CSV with columns a, b and rows x, y; z, w') or an n-column table."""
    n = rng.randint(2, 5)
    columns = rng.sample(COLUMNS, n)
    rows = [[_cell(rng, c) for c in columns] for _ in range(rng.randint(1, 3))]
    text = "\n".join(",".join(r) for r in [columns] + rows)
    if rng.random() < 0.35:
        return rng.choice([f"A {n}-column table.", f"A {n}-column table", f"Make a table with {n} columns."]), text
    stated = "; ".join(", ".join(r) for r in rows)
    lead = rng.choice(["Write CSV with columns", "CSV: columns", "Make a CSV table with columns"])
    return f"{lead} {', '.join(columns)} and rows {stated}.", text


def copy_task(rng: random.Random) -> tuple[str, str]:
    """Copy a span of the request: the plainest form of what a schema answer does with each stated value
    (pure copies are also what lets a small model learn to attend to a span and read it out in order)."""
    kind = rng.randint(0, 3)
    if kind == 0:
        name = V.person(rng) if rng.random() < 0.5 else V.proper(rng)
        return f"Say hello to {name}.", f"Hello, {name}!"
    if kind == 1:
        w = V.word(rng)
        return f"Repeat the word {w} twice.", f"{w} {w}"
    text = V.phrase(rng, 2, 12)
    if kind == 2:
        return rng.choice([f"Echo: {text}", f"Repeat after me: {text}", f"Copy this: {text}"]), text
    facts = {V.key(rng): V.phrase(rng, 1, 3) for _ in range(rng.randint(2, 4))}
    wanted = rng.choice(list(facts))
    listed = "; ".join(f"{k} {v}" for k, v in facts.items())
    return f"From {listed}: what is the {wanted}?", facts[wanted]


TASKS: tuple[tuple[Callable[[random.Random], tuple[str, str]], float], ...] = (
    (arithmetic_result, 3.0), (arithmetic_expression, 1.5), (sql_query, 2.5), (csv_rows, 2.0), (copy_task, 5.0))


def plain_task(rng: random.Random) -> tuple[str, str]:
    fns, weights = zip(*TASKS)
    return rng.choices(fns, weights)[0](rng)
