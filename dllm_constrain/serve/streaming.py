"""The deltas a stream may send of a denoising canvas's final text.

A dLLM commits canvas positions in any order, so the only text a client can be shown without ever taking it back
is the committed left prefix: the positions committed contiguously from the left, up to the first EOS (the engine
computes it: `RequestState.committed_prefix`, delivered as `StreamUpdate`s through `LLM.submit(on_stream=...)`).
This module turns the decoded prefix into append-only text deltas, for the server and `AsyncLLM.stream` alike:

- a token may carry only part of a multi-byte UTF-8 character (byte-level BPE); its decoded prefix then ends in
  U+FFFD, which is held back until the rest of the character is committed;
- stop strings cut the text at their first occurrence; a tail that could still grow into a stop string is held
  back, so a stream never sends text the final answer does not contain.
"""
from __future__ import annotations

from collections.abc import Sequence

REPLACEMENT = "\ufffd"


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """(text before the earliest stop string, whether one occurs)."""
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


def _unsafe_tail(text: str, stop: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string (it may become one)."""
    longest = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:k]):
                longest = k
                break
    return longest


class CommittedText:
    """Append-only text of one request: `advance` with each newly decoded committed prefix returns the delta a
    stream may send; `finish` with the final answer returns the remaining delta and the answer after stop strings.

    The invariant: the concatenation of all deltas is a prefix of the final answer (and equals it after
    `finish`), as long as decoding a longer id prefix extends the text decoded from a shorter one (true of
    byte-level BPE once partial characters are held back). If a decoder breaks that, deltas pause until `finish`.
    """

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self.stop = tuple(s for s in stop if s)
        self.sent = ""
        self.stopped = False  # a stop string occurred in the committed prefix: nothing more will be sent

    def _visible(self, text: str, final: bool) -> str:
        text, hit = cut_at_stop(text, self.stop)
        if hit:
            self.stopped = True
            return text
        if not final:
            text = text.rstrip(REPLACEMENT)  # a character whose remaining bytes are not committed yet
            tail = _unsafe_tail(text, self.stop)
            text = text[: len(text) - tail]
        return text

    def _delta(self, visible: str) -> str:
        if not visible.startswith(self.sent):
            return ""
        delta, self.sent = visible[len(self.sent):], visible
        return delta

    def advance(self, prefix_text: str) -> str:
        """The new final text given the decoded committed prefix ("" when nothing new is safe to send)."""
        if self.stopped:
            return ""
        return self._delta(self._visible(prefix_text, final=False))

    def finish(self, answer: str) -> tuple[str, str, bool]:
        """(answer cut at the first stop string, the delta still to send, whether a stop string cut it)."""
        stopped_before = self.stopped
        visible = self._visible(answer, final=True)
        if stopped_before and not visible.startswith(self.sent):
            visible = self.sent  # cannot happen with a prefix-consistent decoder; never contradict what was sent
        return visible, self._delta(visible), self.stopped
