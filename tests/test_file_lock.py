"""gateway/file_lock.py: the flock the ONNX export cache and hub downloads hold across threads and processes."""
import threading
import time

import pytest

from gateway.file_lock import FileLock


def test_a_held_lock_makes_the_next_one_wait_until_its_deadline(tmp_path):
    path = tmp_path / "x.lock"
    with FileLock(path, timeout_s=5):
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="held for more than"):
            with FileLock(path, timeout_s=0.3):
                pass
        assert time.monotonic() - started >= 0.3
    with FileLock(path, timeout_s=0.3):  # released: taken at once
        pass


def test_a_waiter_gets_the_lock_once_it_is_released(tmp_path):
    path, order = tmp_path / "x.lock", []

    def waiter():
        with FileLock(path, timeout_s=10):
            order.append("waiter")

    with FileLock(path, timeout_s=5):
        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.5)
        order.append("holder done")
    thread.join(10)
    assert order == ["holder done", "waiter"]
