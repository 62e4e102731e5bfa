"""`draftless chat`: a read-eval-print loop over `draftless.chat.Conversation`.

    draftless chat --model smollm2 --spec --spec-ref notes.md --system "Be brief."

Each line is a user message; the reply streams to stdout. Commands: /reset, /ref FILE,
/stats, /help, /quit (a line starting with // sends a message that starts with /).
On a terminal the prompt is `> ` with readline editing and a history file; when stdin is a
pipe, lines are read plainly and no prompt is printed, so the output is the replies alone.
With --spec a one-line summary of the turn's speculation goes to stderr after each reply.

Ctrl-C during a reply sets a flag that the conversation polls between decoder steps: the
turn ends after the current step, keeps what was committed (see chat.py, "Interruption"),
and the REPL goes on. A second Ctrl-C during the same reply interrupts the step itself,
which the decoder undoes. At the prompt, Ctrl-C twice in a row, Ctrl-D or /quit exit with
status 0. A mistake inside the REPL (a bad /ref file, an unknown command) prints one line
and the REPL goes on; at start-up the same mistakes exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from types import FrameType
from typing import Any, TextIO

from draftless.chat import Conversation
from draftless.cli.common import (
    MAX_REFERENCE_BYTES,
    MAX_REFERENCES,
    UsageError,
    add_model_options,
    add_sampling_options,
    add_spec_options,
    add_stop_options,
    checked_text,
    edits_summary,
    make_source,
    open_model,
    read_text_file,
    sampling_from,
    spec_from,
    stop_texts,
)
from draftless.errors import UserError
from draftless.progress import Spinner

HELP = f"""commands:
  /reset        start a new conversation (reference documents are kept)
  /ref FILE     add a reference document to draft from (--spec; up to {MAX_REFERENCES}, \
{MAX_REFERENCE_BYTES // (1024 * 1024)} MiB each)
  /stats        speculation and speed statistics of this conversation
  /help         this help
  /quit         leave (also Ctrl-D, or Ctrl-C twice)
a line starting with // sends a message that starts with /"""

HISTORY_LINES = 1000


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "chat", help="chat with a model in a REPL (--spec to speculate, losslessly)"
    )
    add_model_options(p)
    p.add_argument("--system", help="system message")
    p.add_argument("--max-new-tokens", "-n", type=int, default=512, help="per reply (512)")
    add_stop_options(p, what="a reply")
    add_sampling_options(p)
    add_spec_options(p)
    p.set_defaults(func=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    options = spec_from(args)
    if args.system is not None and not checked_text(args.system, "--system").strip():
        raise UsageError("--system is empty")
    documents = [(path, read_text_file(path, "reference")) for path in args.spec_ref]
    sampling = sampling_from(args)
    sequences = stop_texts(args)
    model = open_model(args)
    try:
        conv = Conversation(
            model,
            system=args.system,
            sampling=sampling,
            speculation=args.spec,
            spec_options=options,
            extra_stop_ids=args.stop_id,
            stop_sequences=sequences,
            max_new_tokens=args.max_new_tokens,
            index_factory=partial(make_source, model, (), edits=False) if args.no_edits else None,
        )
        for path, text in documents:
            with Spinner(f"tokenizing {path}"):
                conv.add_reference_text(text)
        return Repl(conv).run()
    finally:
        model.close()


class _Interrupt:
    """A SIGINT handler for the length of a reply: the first Ctrl-C sets the flag that the
    conversation polls between steps; a second one raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self) -> bool:
        return self.requested

    def _handler(self, _signum: int, _frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    @contextmanager
    def installed(self) -> Iterator[_Interrupt]:
        try:
            previous = signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main thread: no handler, Ctrl-C stays an exception
            yield self
            return
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)


class Repl:
    def __init__(
        self,
        conv: Conversation,
        *,
        stdin: TextIO | None = None,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        interactive: bool | None = None,
    ) -> None:
        self.conv = conv
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        if interactive is None:
            interactive = self.stdin.isatty()
        self.interactive = interactive
        self.seconds = 0.0  # wall time of every reply since the last reset
        self.replies = 0
        self._history_file: str | None = None

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> int:
        if self.interactive:
            self._start_readline()
            self._note(self._banner())
        ctrl_c = False
        try:
            while True:
                try:
                    line = self._read_line()
                except EOFError:
                    if self.interactive:
                        self.stdout.write("\n")
                    return 0
                except KeyboardInterrupt:
                    self.stdout.write("\n")
                    if ctrl_c:
                        return 0
                    ctrl_c = True
                    self._note("(Ctrl-C again, Ctrl-D or /quit to leave)")
                    continue
                ctrl_c = False
                if not self.handle(line):
                    return 0
        finally:
            self._save_history()

    def handle(self, line: str) -> bool:
        """One input line; False when the REPL should end."""
        text = line.rstrip("\r\n")
        stripped = text.strip()
        if not stripped:
            return True  # an empty line sends nothing
        try:
            if stripped.startswith("/") and not stripped.startswith("//"):
                return self.command(stripped)
            if stripped.startswith("//"):
                text = stripped[1:]
            self.turn(text)
        except UserError as err:
            self._error(str(err))
        except KeyboardInterrupt:  # during a command (e.g. tokenizing a large reference)
            self._note("\n[interrupted]")
        return True

    # -- a turn ----------------------------------------------------------------------------
    def turn(self, text: str) -> None:
        interrupt = _Interrupt()
        wrote = False
        previous = self.conv.last_reply
        with interrupt.installed():
            try:
                for piece in self.conv.stream(text, interrupt=interrupt):
                    self.stdout.write(piece)
                    self.stdout.flush()
                    wrote = True
            except KeyboardInterrupt:  # a second Ctrl-C inside a step: the step is undone
                pass
            except UserError as err:
                if wrote:
                    self.stdout.write("\n")
                self._error(str(err))
                return
        self.stdout.write("\n")
        self.stdout.flush()
        reply = self.conv.last_reply
        if reply is None or reply is previous:  # interrupted before the reply started
            self._note("[interrupted]")
            return
        self.seconds += reply.seconds
        self.replies += 1
        if reply.stop_reason == "interrupted":
            self._note("[interrupted]")
        elif reply.stop_reason == "context":
            self._note(
                f"[the context ({self.conv.n_ctx} tokens) is full: the reply ends here; "
                "/reset to start a new conversation]"
            )
        elif reply.stop_reason == "length":
            self._note(f"[stopped at {len(reply.token_ids)} tokens: --max-new-tokens]")
        if self.conv.speculation:
            self._note(
                f"{len(reply.token_ids)} tokens, {_rate(len(reply.token_ids), reply.seconds)}; "
                + reply.stats.summary()
            )

    # -- commands --------------------------------------------------------------------------
    def command(self, line: str) -> bool:
        name, _, rest = line.partition(" ")
        rest = rest.strip()
        if name in ("/quit", "/exit"):
            return False
        if name == "/help":
            self._say(HELP)
        elif name == "/reset":
            self.conv.reset()
            self.seconds, self.replies = 0.0, 0
            kept = len(self.conv.references)
            self._say("(new conversation" + (f"; {kept} reference(s) kept)" if kept else ")"))
        elif name == "/ref":
            self.add_reference(rest)
        elif name == "/stats":
            self._say(self.stats())
        else:
            raise UsageError(f"unknown command {name} (try /help)")
        return True

    def add_reference(self, path: str) -> None:
        if not path:
            raise UsageError("usage: /ref FILE")
        if not self.conv.speculation:
            raise UsageError("/ref needs speculation: start the chat with --spec")
        if len(self.conv.references) >= MAX_REFERENCES:
            raise UsageError(f"at most {MAX_REFERENCES} references")
        path = os.path.expanduser(path)
        text = read_text_file(path, "reference")
        with Spinner(f"tokenizing {path}"):
            slot = self.conv.add_reference_text(text)
        self._say(f"(reference[{slot}]: {path}, {len(self.conv.references[-1])} tokens)")

    def stats(self) -> str:
        conv, s = self.conv, self.conv.stats
        lines = [
            f"turns {conv.turns}, {len(conv.history)} tokens in the conversation"
            + (f" (context {conv.n_ctx})" if conv.n_ctx else "")
            + f", {s.committed} generated in {self.seconds:.2f} s "
            + f"({_rate(s.committed, self.seconds)})"
        ]
        if conv.speculation:
            lines.append(s.summary())
            edits = edits_summary(conv.index)
            if edits is not None:
                lines.append(edits)
            lines.append(f"references: {len(conv.references)}")
        else:
            lines.append("speculation off (start with --spec to speculate)")
        return "\n".join(lines)

    # -- input and output ------------------------------------------------------------------
    def _read_line(self) -> str:
        if self.interactive:
            return input("> ")
        line = self.stdin.readline()
        if not line:
            raise EOFError
        return line

    def _banner(self) -> str:
        model = self.conv.model
        mode = "speculation on" if self.conv.speculation else "plain decoding"
        refs = len(self.conv.references)
        extra = f", {refs} reference(s)" if refs else ""
        return (
            f"draftless chat: {model.name} ({model.backend}), {mode}{extra}. "
            "/help for commands, Ctrl-D to quit."
        )

    def _say(self, text: str) -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def _note(self, text: str) -> None:
        self.stderr.write(text + "\n")
        self.stderr.flush()

    def _error(self, text: str) -> None:
        self._note(f"error: {text}")

    def _start_readline(self) -> None:
        try:
            import readline
        except ImportError:  # no readline (e.g. Windows): input() still works
            return
        from draftless.models.base import cache_dir

        path = cache_dir() / "chat_history"
        self._history_file = str(path)
        readline.set_history_length(HISTORY_LINES)
        try:
            if path.is_file():
                readline.read_history_file(str(path))
        except OSError:
            pass

    def _save_history(self) -> None:
        if self._history_file is None:
            return
        try:
            import readline

            os.makedirs(os.path.dirname(self._history_file), exist_ok=True)
            readline.write_history_file(self._history_file)
        except (ImportError, OSError):
            pass


def _rate(tokens: int, seconds: float) -> str:
    return f"{tokens / seconds:.1f} tok/s" if seconds > 0 else "- tok/s"


__all__ = ["Repl", "cmd_chat", "register"]
