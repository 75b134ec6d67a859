"""Bounded per-cell output capture and the head+tail truncation shown to the model.

Why bounded: a cell that prints in a loop until it is killed must not grow the host's memory, and
the model only ever sees `max_output_chars` anyway. We keep the head and a rolling tail and count
what was dropped, so the note can say how much is missing.
"""

from __future__ import annotations

from collections import deque

__all__ = ["Capture", "truncate", "truncation_note"]


def truncation_note(dropped: int) -> str:
    """The hint inserted where output was cut; tells the model how to get at the rest."""
    return (
        f"\n[... {dropped:,} chars truncated; the full value is still in your variables: slice it, "
        "e.g. print(x[:2000]) or print(x[-2000:]), or summarise it (len, keys, counts) ...]\n"
    )


def truncate(text: str, max_chars: int) -> tuple[str, bool]:
    """Cut `text` to roughly `max_chars` as head + note + tail. Returns (text, truncated)."""
    if len(text) <= max_chars:
        return text, False
    head = max_chars * 2 // 3
    tail = max_chars - head
    dropped = len(text) - head - tail
    return text[:head] + truncation_note(dropped) + (text[-tail:] if tail else ""), True


class Capture:
    """A write-only text stream that keeps the first and last `max_chars` characters."""

    def __init__(self, max_chars: int) -> None:
        self._limit = max(max_chars, 0)
        self._head: list[str] = []
        self._head_len = 0
        self._tail: deque[str] = deque()
        self._tail_len = 0
        self._total = 0

    def write(self, text: str) -> int:
        """Append `text` (str only, like a text file)."""
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        n = len(text)
        self._total += n
        room = self._limit - self._head_len
        if room > 0:
            piece = text[:room]
            self._head.append(piece)
            self._head_len += len(piece)
            text = text[room:]
        if text:
            self._tail.append(text[-self._limit :] if self._limit else "")
            self._tail_len += len(self._tail[-1])
            while self._tail and self._tail_len - len(self._tail[0]) >= self._limit:
                self._tail_len -= len(self._tail.popleft())
        return n

    def flush(self) -> None:
        """No-op (print(flush=True) calls it)."""

    def isatty(self) -> bool:
        """Never a terminal."""
        return False

    def getvalue(self, max_chars: int) -> tuple[str, bool]:
        """Return the captured text, truncated head+tail to `max_chars`. Returns (text, truncated)."""
        head = "".join(self._head)
        if self._total == self._head_len:
            return truncate(head, max_chars)
        tail = "".join(self._tail)
        kept_tail = tail[-self._limit :] if self._limit else ""
        dropped_middle = self._total - len(head) - len(kept_tail)
        # Re-truncate the reconstructed view so the budget is respected whatever the ratios.
        keep_head = max_chars * 2 // 3
        keep_tail = max_chars - keep_head
        shown_tail = kept_tail[-keep_tail:] if keep_tail else ""
        dropped = (
            dropped_middle + (len(head) - min(len(head), keep_head)) + (len(kept_tail) - len(shown_tail))
        )
        return head[:keep_head] + truncation_note(dropped) + shown_tail, True
