"""A spinner for long waits (model load, conversion, probe) on an interactive terminal only.

Nothing is drawn when stderr is not a TTY (a pipe, a file, CI), so machine-read output stays
clean.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from types import TracebackType
from typing import TextIO


class Spinner:
    FRAMES = "|/-\\"

    def __init__(self, message: str, stream: TextIO | None = None, *, force: bool = False) -> None:
        self.message = message
        self.stream = stream or sys.stderr
        self.enabled = force or (hasattr(self.stream, "isatty") and self.stream.isatty())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def __enter__(self) -> Spinner:
        self._t0 = time.perf_counter()
        if self.enabled:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        for frame in itertools.cycle(self.FRAMES):
            if self._stop.wait(0.1):
                break
            elapsed = time.perf_counter() - self._t0
            self.stream.write(f"\r{frame} {self.message} ({elapsed:.0f}s)")
            self.stream.flush()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.stream.write("\r\033[K")
            self.stream.flush()
