"""How long a piece of work has left, as a person sees it: a live bar on a terminal (tqdm), plain periodic lines
everywhere else (a log, a pipe, `--quiet`), so no file ever holds a bar's carriage-return frames."""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm


def clock(seconds: float) -> str:
    """12:05 or 1:02:05."""
    minutes, s = divmod(int(round(seconds)), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}:{m:02d}:{s:02d}" if hours else f"{m}:{s:02d}"


class Progress:
    """`total` steps of `name`, from `initial`: `update()` after each, `show(key=value)` for what the line or bar
    carries beside the count (the loss, the latest validation metric), `close()` at the end. Nothing at all when
    not `enabled` (another rank's, or progress turned off)."""

    def __init__(self, total: int, name: str, *, initial: int = 0, enabled: bool = True, every_s: float = 60.0):
        self.total, self.name, self.done, self.every_s = total, name, initial, every_s
        self.enabled, self.values, self.started, self.first = enabled, {}, time.time(), initial
        self.bar = tqdm(total=total, initial=initial, desc=name, dynamic_ncols=True, file=sys.stderr) \
            if enabled and sys.stderr.isatty() else None
        self.shown = self.started

    def show(self, **values) -> None:
        self.values.update(values)
        if self.bar is not None:
            self.bar.set_postfix(self.values, refresh=False)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.enabled and time.time() - self.shown >= self.every_s:
            self.line()

    def line(self) -> None:
        """One plain line: the count, time spent, time left at the rate so far, and the values shown."""
        self.shown = now = time.time()
        rate = (self.done - self.first) / max(now - self.started, 1e-9)
        left = f", about {clock((self.total - self.done) / rate)} left" if rate > 0 and self.done < self.total else ""
        values = "".join(f", {k} {v}" for k, v in self.values.items())
        print(f"edgebert: {self.name}: {self.done}/{self.total} ({100 * self.done / max(self.total, 1):.0f}%), "
              f"{clock(now - self.started)}{left}{values}", file=sys.stderr, flush=True)

    def write(self, message: str) -> None:
        """A line above the bar (or among the plain lines)."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.done > self.first:
            self.line()
