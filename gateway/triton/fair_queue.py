"""Work of many owners waiting for one shared thing (issues 55 and 56): the embeddings coalescer's next
Triton call (gateway/triton/coalesce.py), a completion slot (gateway/triton/fair_slots.py).

An owner is whose share a waiting item counts against: an API key's id, or without keys the client's
address (as for the body budget, gateway/middleware/body_limits.py `owner_of`). Three rules:

- bounded: at most `limit` units (rows, sequences) wait in all, and one owner at most `share` of them, so that
  no one client fills the queue alone; over either, `put` raises QueueFull and the caller answers 503;
- round-robin across owners: `pop` takes the oldest item of the owner whose turn it is, then that owner goes
  to the back of the rotation, so another owner's item waits behind at most one item of each other owner,
  never behind one owner's whole backlog;
- arrival order within an owner (with one owner, a plain FIFO).

Plain data, no asyncio and no Triton: the callers hold it on one event loop. No maintained library fits:
asyncio's queues and `aio-fairshare` (a young fair semaphore) have no sized items, no per-owner bound on
what waits and no look at the next item, which the coalescer needs to fill a call up to its rows."""
from __future__ import annotations

from collections import OrderedDict, deque
from typing import Generic, Hashable, TypeVar

T = TypeVar("T")


class QueueFull(Exception):
    """`put` over the bound: `whole` when the queue is full, else it is the owner's share that is."""

    def __init__(self, whole: bool, waiting: int, bound: int):
        super().__init__(f"{waiting} waiting, the {'limit' if whole else 'share'} of {bound}")
        self.whole, self.waiting, self.bound = whole, waiting, bound


class FairQueue(Generic[T]):
    def __init__(self, limit: int, share: int | None = None):
        if limit < 1 or (share is not None and share < 1):
            raise ValueError(f"a fair queue's limit and share must be >= 1, not {limit}, {share}")
        self.limit = limit
        self.share = min(share or limit, limit)
        self._owners: OrderedDict[Hashable, deque[tuple[T, int]]] = OrderedDict()  # rotation order
        self.held: dict[Hashable, int] = {}  # units waiting per owner (an owner with none has no entry)
        self.size = 0  # units waiting, all owners
        self.count = 0  # items waiting

    def __len__(self) -> int:
        return self.count

    def put(self, owner: Hashable, item: T, size: int = 1) -> None:
        """Queue `item` (of `size` units) at the back of its owner's line, or raise QueueFull."""
        if self.size + size > self.limit:
            raise QueueFull(True, self.size, self.limit)
        mine = self.held.get(owner, 0)
        if mine + size > self.share:
            raise QueueFull(False, mine, self.share)
        line = self._owners.get(owner)
        if line is None:  # a new owner joins the rotation at its back
            line = self._owners[owner] = deque()
        line.append((item, size))
        self.held[owner] = mine + size
        self.size += size
        self.count += 1

    def peek(self) -> tuple[T, int] | None:
        """(item, size) that `pop` would take next, or None when nothing waits."""
        for line in self._owners.values():
            return line[0]
        return None

    def pop(self) -> tuple[Hashable, T]:
        """(owner, item) of the owner whose turn it is; that owner then goes to the back of the rotation."""
        owner, line = next(iter(self._owners.items()))
        item, size = line.popleft()
        if line:
            self._owners.move_to_end(owner)
        else:
            del self._owners[owner]
        self._taken(owner, size)
        return owner, item

    def remove(self, owner: Hashable, item: T) -> bool:
        """Take `item` out wherever it waits (its request left, or its deadline passed); False if not here."""
        line = self._owners.get(owner)
        if line is None:
            return False
        for index, (queued, size) in enumerate(line):
            if queued is item:
                del line[index]
                if not line:
                    del self._owners[owner]
                self._taken(owner, size)
                return True
        return False

    def _taken(self, owner: Hashable, size: int) -> None:
        self.size -= size
        self.count -= 1
        mine = self.held[owner] - size
        if mine > 0:
            self.held[owner] = mine
        else:
            del self.held[owner]
