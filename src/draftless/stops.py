"""Text stop sequences: where one starts in decoded text, and how much text to hold back.

A stop sequence is text, not tokens: "\\n\\n" may arrive as one token or as two, or inside a
token that also carries the next word. So the generated tokens are decoded incrementally
and the text is searched; text that could be the start of a stop sequence is held back from
the screen until the next tokens decide.

    stops = TextStops(["\\n\\n", "END"])
    for token in tokens:
        shown = stops.push(token_text)  # text that can be shown now ("" while undecided)
        if stops.cut is not None:       # a stop sequence starts at stops.text[stops.cut]
            break
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def find_stop(text: str, sequences: Sequence[str], start: int) -> int | None:
    """Index in `text` of the earliest stop sequence that ends after `start`, or None."""
    hits = [i for s in sequences if (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None


def held_back(text: str, sequences: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that could start a stop sequence."""
    best = 0
    for s in sequences:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if s.startswith(text[-n:]):
                best = n
                break
    return best


def unescape(text: str) -> str:
    r"""`\n` and `\t` typed on a command line, as the characters (`\\` is a backslash)."""
    out, i = [], 0
    while i < len(text):
        pair = text[i : i + 2]
        if pair in ("\\n", "\\t", "\\\\"):
            out.append({"\\n": "\n", "\\t": "\t", "\\\\": "\\"}[pair])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


class TextStops:
    """Accumulates decoded text, finds the first stop sequence, says what is safe to show.

    `text` is everything pushed, cut before the stop sequence once one is found (`cut` is
    then where it started, and further pushes are refused).
    """

    def __init__(self, sequences: Iterable[str]) -> None:
        self.sequences = tuple(sequences)
        for s in self.sequences:
            if not isinstance(s, str) or not s:
                raise ValueError(f"a stop sequence must be non-empty text, got {s!r}")
        self._hold = max((len(s) for s in self.sequences), default=1) - 1
        self.text = ""
        self.cut: int | None = None
        self._shown = 0

    def push(self, piece: str) -> str:
        """Add decoded text; return the text that can be shown now."""
        if self.cut is not None:
            raise RuntimeError("a stop sequence was already found")
        start = max(0, len(self.text) - self._hold)
        self.text += piece
        cut = find_stop(self.text, self.sequences, start)
        if cut is not None:
            self.cut = cut
            self.text = self.text[:cut]
            return self._show(len(self.text))
        return self._show(len(self.text) - held_back(self.text, self.sequences))

    def finish(self) -> str:
        """The end of the text: what was held back is shown (no stop sequence followed)."""
        return self._show(len(self.text))

    def _show(self, upto: int) -> str:
        new = self.text[self._shown : upto] if upto > self._shown else ""
        self._shown = max(self._shown, upto)
        return new
