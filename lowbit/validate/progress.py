"""A progress bar on stderr for long audits: ``progress_bar(label)`` returns ``update(i, n, what)``.

On a terminal the bar redraws in place (``label [#####-----] i/n what``) and ends with a newline at
``i == n``; elsewhere (CI logs, pipes) it prints one line per tenth of the way and the last one.
"""
from __future__ import annotations

import sys

__all__ = ["progress_bar"]


def progress_bar(label: str, stream=None, width: int = 24):
    out = stream if stream is not None else sys.stderr
    tty = bool(getattr(out, "isatty", lambda: False)())
    last = [-1]

    def update(i: int, n: int, what: str = "") -> None:
        frac = i / n if n else 1.0
        fill = int(round(width * frac))
        line = f"{label} [{'#' * fill}{'-' * (width - fill)}] {i}/{n} {what}"
        if tty:
            out.write("\r" + line[:200].ljust(80) + ("\n" if i >= n else ""))
        else:
            tenth = int(frac * 10)
            if tenth == last[0] and i < n:
                return
            last[0] = tenth
            out.write(line + "\n")
        out.flush()

    return update
