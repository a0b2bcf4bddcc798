"""Open distributions of the values a request states: names, words, numbers, dates, free text, keys.

Values are built from syllables, digits and random choices rather than drawn from closed lists, so a model
trained on them cannot pick an answer from memory: the only way to write the value is to copy it from the
request. Every draw goes through the caller's `random.Random`, so a seed fixes the stream.
"""
from __future__ import annotations

import random
import string

ONSETS = ["b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "br", "ch",
          "cl", "dr", "fl", "gr", "kr", "pl", "sh", "st", "th", "tr", "y", ""]
VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ai", "ea", "ou", "ie", "y"]
CODAS = ["", "", "", "n", "r", "l", "s", "t", "m", "nd", "rk", "x", "ck", "ss", "ng"]
TLDS = ["com", "org", "net", "io", "dev", "edu", "co", "app"]
# A few everyday words mixed into free text, so phrases are not all pseudo-words.
COMMON = ["the", "old", "new", "blue", "red", "green", "small", "big", "quick", "river", "stone", "light", "north",
          "south", "garden", "market", "station", "paper", "silver", "winter", "summer", "house", "road", "lake"]


def syllable(rng: random.Random) -> str:
    return rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS)


def word(rng: random.Random, lo: int = 1, hi: int = 3) -> str:
    """A pronounceable lowercase pseudo-word of lo..hi syllables (sometimes an everyday word)."""
    if rng.random() < 0.15:
        return rng.choice(COMMON)
    w = "".join(syllable(rng) for _ in range(rng.randint(lo, hi)))
    return w if len(w) >= 2 else w + rng.choice("aeiou") + rng.choice("nrst")


def proper(rng: random.Random) -> str:
    return word(rng, 1, 3).capitalize()


def person(rng: random.Random) -> str:
    parts = [proper(rng), proper(rng)]
    if rng.random() < 0.1:
        parts.insert(1, proper(rng))
    return " ".join(parts)


def handle(rng: random.Random) -> str:
    base = word(rng, 1, 2)
    return base + (str(rng.randint(0, 999)) if rng.random() < 0.6 else rng.choice(["_", ".", ""]) + word(rng, 1, 1))


def phrase(rng: random.Random, lo: int = 2, hi: int = 6) -> str:
    text = " ".join(word(rng, 1, 3) for _ in range(rng.randint(lo, hi)))
    return text.capitalize() if rng.random() < 0.5 else text


def code(rng: random.Random) -> str:
    letters = "".join(rng.choice(string.ascii_uppercase) for _ in range(rng.randint(2, 4)))
    return f"{letters}-{rng.randint(0, 99999):0{rng.randint(2, 5)}d}"


def integer(rng: random.Random, lo: int | None = None, hi: int | None = None) -> int:
    """An integer of a random magnitude (1-6 digits, sometimes negative), clipped to [lo, hi]."""
    if lo is not None and hi is not None:
        return rng.randint(lo, hi)
    magnitude = rng.choice([9, 99, 999, 9999, 99999, 999999])
    value = rng.randint(0, magnitude)
    if lo is None and rng.random() < 0.12:
        value = -value
    if lo is not None:
        value = lo + value if value < lo else value
    if hi is not None:
        value = min(value, hi)
    return value


def number(rng: random.Random, lo: float | None = None) -> float:
    """A decimal with 1-3 places (written as JSON writes it), at or above lo when given."""
    places = rng.choice([1, 2, 2, 3])
    base = rng.uniform(0, rng.choice([1, 10, 100, 1000, 10000]))
    if lo is None and rng.random() < 0.12:
        base = -base
    value = round((lo or 0.0) + base if lo is not None else base, places)
    if value == int(value):  # keep a fractional part: "12.0" would be written "12.0" and stated "12.0"
        value = round(value + 0.5, places)
    return value


def date(rng: random.Random) -> str:
    return f"{rng.randint(1900, 2099)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def time_of_day(rng: random.Random) -> str:
    return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z"


def date_time(rng: random.Random) -> str:
    return f"{date(rng)}T{time_of_day(rng)}"


def email(rng: random.Random) -> str:
    return f"{word(rng, 1, 2)}{rng.choice(['', '.', '_'])}{word(rng, 1, 2)}@{word(rng, 1, 2)}.{rng.choice(TLDS)}"


def uri(rng: random.Random) -> str:
    path = "/".join(word(rng, 1, 2) for _ in range(rng.randint(0, 2)))
    return f"https://{word(rng, 1, 2)}.{rng.choice(TLDS)}" + (f"/{path}" if path else "")


def uuid(rng: random.Random) -> str:
    return "-".join("".join(rng.choice("0123456789abcdef") for _ in range(n)) for n in (8, 4, 4, 4, 12))


def phone(rng: random.Random) -> str:
    return f"+{rng.randint(1, 99)} {rng.randint(100, 999)} {rng.randint(1000, 9999)}"


def key(rng: random.Random) -> str:
    """An unseen property name: snake_case (mostly) or camelCase of 1-2 pseudo-words."""
    parts = [word(rng, 1, 2) for _ in range(rng.randint(1, 2))]
    if rng.random() < 0.2 and len(parts) > 1:
        return parts[0] + "".join(p.capitalize() for p in parts[1:])
    return "_".join(parts)


STRING_KINDS = {"person": person, "handle": handle, "place": proper, "word": word, "phrase": phrase, "code": code,
                "phone": phone}
FORMAT_KINDS = {"email": email, "date": date, "date-time": date_time, "time": time_of_day, "uri": uri,
                "uuid": uuid}
