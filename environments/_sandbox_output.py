"""Output capture of one sandboxed run (internals of `environments.sandbox`).

Reads the program's stdout and stderr without blocking, keeps at most `cap` bytes of each,
and stops at the wall-clock deadline or when either stream overflows; the caller then
kills the sandbox.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time

_READ_BYTES = 64 * 1024


def pump(proc, cap: int, deadline: float):
    """Read stdout/stderr up to the cap; stop at the deadline or the cap.
    Returns ((stdout, truncated), (stderr, truncated), timed_out)."""
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    trunc = {proc.stdout: False, proc.stderr: False}
    sel = selectors.DefaultSelector()
    for f in bufs:
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    timed_out = False
    try:
        while sel.get_map() and not any(trunc.values()):
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            # Once the program itself has exited, drain what is buffered and stop: strays
            # holding the pipes open (possible in the fallback) must not keep us here.
            exited = proc.poll() is not None
            events = sel.select(0 if exited else min(left, 0.05))
            if exited and not events:
                break
            for key, _ in events:
                f = key.fileobj
                try:
                    data = os.read(f.fileno(), _READ_BYTES)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(f)
                    continue
                room = cap - len(bufs[f])
                bufs[f] += data[:room]
                trunc[f] = trunc[f] or len(data) > room
        if not timed_out and not any(trunc.values()):
            try:  # output closed; the program may still be running
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        sel.close()
    text = {f: b.decode("utf-8", "replace") for f, b in bufs.items()}
    return ((text[proc.stdout], trunc[proc.stdout]), (text[proc.stderr], trunc[proc.stderr]), timed_out)
