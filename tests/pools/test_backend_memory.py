"""The request table is mapped lazily in 4 KiB pages: a token written to a row costs a page, not a huge page."""

import os

import numpy as np
import pytest

from poolsim.pools.backend import get_backend


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc to read RSS")
def test_touching_every_row_of_a_large_table_costs_pages_not_the_table():
    xp = get_backend(None)
    rows, width = 256, 1 << 18  # 256 MiB of int32, as a req_to_token table of 256 rows x 256k tokens
    table = xp.zeros_int32((rows, width))
    assert table.shape == (rows, width) and table.dtype == np.int32 and table.flags.writeable
    before = _rss_kib()
    table[:, 0] = np.arange(rows)  # one token per row, as the first token of 256 requests
    table[7, 5:9] = [1, 2, 3, 4]
    grown_mib = (_rss_kib() - before) / 1024
    assert grown_mib < 32, f"{grown_mib:.0f} MiB resident after writing 260 ints"  # 2 MiB huge pages: 256 MiB
    assert int(table[7, :10].sum()) == 7 + 10 and int(table.sum(dtype=np.int64)) == sum(range(rows)) + 10
    small = xp.zeros_int32((3, 4))
    assert small.tolist() == [[0] * 4] * 3


def test_a_freed_array_is_kept_uncopied_only_when_nothing_can_change_it():
    """The free list keeps a freed array itself only when the array owning its memory is read-only (a tree
    node's slots); anything else (a view of a writeable table, a writeable array) is copied, so a caller that
    rewrites its buffer afterwards cannot change the free list."""
    from poolsim.pools.mem_cache.allocator.free_list import FreeList

    xp = get_backend(None)
    node_slots = np.array([7, 8, 9], dtype=np.int64)
    node_slots.flags.writeable = False
    assert xp.keep(node_slots) is node_slots
    assert xp.keep(node_slots[1:]).base is node_slots  # a split node's view: still nothing can write it
    table = np.arange(20, dtype=np.int64).reshape(4, 5)
    row_view = table[2, 1:4]
    row_view.flags.writeable = False  # read-only view, but the table under it is writeable
    assert not np.shares_memory(xp.keep(row_view), table)
    plain = np.array([1, 2], dtype=np.int64)
    assert xp.keep(plain) is not plain

    free = FreeList(xp, 20, "slot")
    free.take(20)
    free.push_back(node_slots)
    free.push_back(table[0, 1:3])
    table[0, 1:3] = [15, 16]  # the caller reuses its buffer
    assert free.take(5).tolist() == [7, 8, 9, 1, 2]
