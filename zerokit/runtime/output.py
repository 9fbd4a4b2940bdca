"""Forwarding a rank's output to the caller, whole line by whole line, as ``[rN] line``.

Lifecycle: the parent creates one :class:`LineForwarder` per rank and stream (stdout,
stderr) around the read end of a pipe whose write end becomes the rank's fd 1 or 2
(see :func:`.spawn.redirect_output`). The supervision loop waits on the forwarder like
on any connection (``fileno``) and calls :meth:`~LineForwarder.pump` whenever the pipe
is readable: whole lines are printed at once, a partial line waits for its end. At end
of file, or when the launch stops, :meth:`~LineForwarder.close` prints the partial last
line too, so nothing a rank wrote is lost even when it dies mid-line. Printing happens
in the calling thread, on ``sys.stdout``/``sys.stderr`` looked up at each write, so in
Jupyter it lands in the cell that called ``launch``.
"""
from __future__ import annotations

import os
import sys

__all__ = ["LineForwarder"]


class LineForwarder:
    """One rank's stdout or stderr pipe, printed whole line by whole line as ``[rN] line``."""

    def __init__(self, rank: int, reader, stream: str):
        self.reader = reader
        self.prefix = f"[r{rank}] "
        self.stream = stream  # looked up on sys at each write: in Jupyter it is the cell's stream
        self.pending = b""
        os.set_blocking(reader.fileno(), False)

    def fileno(self) -> int:
        return self.reader.fileno()

    @property
    def closed(self) -> bool:
        return self.reader.closed

    def pump(self) -> None:
        """Print the whole lines the pipe holds now; at end of file, the partial last one too."""
        if self.closed:
            return
        chunks = []
        while True:
            try:
                chunk = os.read(self.reader.fileno(), 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                self.close(b"".join(chunks))
                return
            chunks.append(chunk)
        self._print(b"".join(chunks), final=False)

    def close(self, last: bytes = b"") -> None:
        if not self.closed:
            self._print(last, final=True)
            self.reader.close()

    def _print(self, data: bytes, final: bool) -> None:
        *lines, self.pending = (self.pending + data).split(b"\n")
        if final and self.pending:
            lines.append(self.pending)
            self.pending = b""
        if lines:
            out = getattr(sys, self.stream)
            out.write("".join(f"{self.prefix}{line.decode('utf-8', 'replace')}\n" for line in lines))
            out.flush()
