"""Keeping finished decoupled-BLS response iterators alive until the stub is done with them.

Triton 2.51's stub (python_backend r24.10) also keeps every decoupled BLS ResponseIterator in a map,
which its stub-to-parent thread erases, without holding the GIL, when it sends the iterator's cleanup
message. If that erase drops the last reference, the iterator's responses and their numpy arrays are
freed without the GIL, corrupting the Python heap under the threads running at the same time (seen as
SIGSEGV in libpython's allocator, or a glibc malloc abort, in the BLS fronts under load; an LD_PRELOAD
probe caught _Py_Dealloc without the GIL under SendCleanupId -> ~ResponseIterator -> ~PbTensor).
request.is_cancelled() is a round trip through the same FIFO queue and thread: once it has come
back, every cleanup queued before it is done and the last reference is ours, dropped with the GIL."""
from __future__ import annotations

import threading


class IteratorRelease:
    def __init__(self):
        self._lock = threading.Lock()
        self._held: list = []  # finished iterators whose cleanup may still be queued

    def after_cleanup(self, request, iterators) -> None:
        """Call with a request still live (before its final response is sent: is_cancelled() needs
        it), once every iterator in `iterators` has been read to its end."""
        with self._lock:
            self._held.extend(iterators)
            taken, self._held = self._held, []
        cancelled = True
        try:
            cancelled = request.is_cancelled()
        finally:
            if cancelled:  # answered without the round trip (cached, or failed): a later request frees them
                with self._lock:
                    self._held.extend(taken)
