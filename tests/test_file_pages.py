"""backends/gptj_generator/file_pages.py: the mappings of a file in this process, found through psutil, and
their resident pages dropped (a later read faults them back from the file)."""
from __future__ import annotations

import ctypes
import mmap

from gptj_generator.file_pages import drop_file_pages, mapped_ranges


def test_the_mappings_of_a_file_are_found_and_their_pages_dropped(tmp_path):
    size = 4 * mmap.PAGESIZE
    path, other = tmp_path / "weights.bin", tmp_path / "other.bin"
    path.write_bytes(bytes(range(256)) * (size // 256))
    other.write_bytes(b"\0" * size)
    link = tmp_path / "link.bin"
    link.symlink_to(path)
    assert mapped_ranges(path) == []
    with open(path, "r+b") as f, open(other, "r+b") as g:
        mapping, unrelated = mmap.mmap(f.fileno(), size), mmap.mmap(g.fileno(), size)
        try:
            address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
            ranges = mapped_ranges(link)  # any name of the file: its real path is mapped
            assert len(ranges) == 1 and ranges[0][0] <= address < ranges[0][1]
            assert ranges[0][1] - ranges[0][0] >= size
            assert drop_file_pages(path) >= size
            assert mapping[:256] == bytes(range(256)), "read back from the file after the drop"
        finally:
            mapping.close()
            unrelated.close()
    assert mapped_ranges(path) == []
