"""SWATokenToKVPoolAllocator slot for slot (mem_cache/allocator/swa.py), with hand-derived free lists.

Page size 1: both free lists start 1..size, alloc takes from the head, free appends (FIFO).
Paged: page ids 1..size/page, frees push the sorted unique pages to the front (LIFO).
"""

import numpy as np
import pytest

from poolsim.pools.errors import PoolError
from poolsim.pools.mem_cache.allocator.swa import SWATokenToKVPoolAllocator


def ids(x):
    return np.asarray(x).tolist()


def test_page1_window_release_frees_only_the_swa_peers():
    a = SWATokenToKVPoolAllocator(size=8, size_swa=4, page_size=1)
    assert ids(a.alloc(3)) == [1, 2, 3]
    assert ids(a.full_to_swa_index_mapping[1:4]) == [1, 2, 3] and a.full_to_swa_index_mapping[-1] == -1
    assert a.available_size() == min(5, 1) == 1 and a.alloc(2) is None  # the SWA pool binds
    a.free_swa(np.array([1, 2]))  # tokens 1-2 left the window: SWA peers back, full slots kept
    assert ids(a.swa_attn_allocator.free_pages) == [4, 1, 2] and a.available_size() == 3
    assert ids(a.full_to_swa_index_mapping[1:4]) == [0, 0, 3]
    assert ids(a.alloc(2)) == [4, 5] and ids(a.full_to_swa_index_mapping[4:6]) == [4, 1]
    a.free(np.array([3, 4, 5]))  # SWA first (peers 3, 4, 1), then the full slots
    assert ids(a.swa_attn_allocator.free_pages) == [2, 3, 4, 1]
    assert ids(a.full_attn_allocator.free_pages) == [6, 7, 8, 3, 4, 5]
    with pytest.raises(PoolError, match="no SWA peer"):
        a.free(np.array([1]))  # its peer went with the window: free_full, not free
    a.free_full(np.array([1, 2]))
    assert ids(a.full_attn_allocator.free_pages) == [6, 7, 8, 3, 4, 5, 1, 2] and a.available_size() == 4
    a.check_integrity()


def test_page1_free_group_releases_swa_then_full_in_call_order():
    a = SWATokenToKVPoolAllocator(size=6, size_swa=6, page_size=1)
    a.alloc(4)  # full 1-4 <-> swa 1-4
    a.free_group_begin()
    a.free(np.array([3]))
    a.free(np.array([1]))
    assert ids(a.swa_attn_allocator.free_pages) == [5, 6]  # nothing released inside the group
    a.free_group_end()
    assert ids(a.swa_attn_allocator.free_pages) == [5, 6, 3, 1]
    assert ids(a.full_attn_allocator.free_pages) == [5, 6, 3, 1]
    a.check_integrity()


def test_paged_extend_decode_window_release_and_free():
    a = SWATokenToKVPoolAllocator(size=16, size_swa=8, page_size=4)
    # 6 tokens, empty prefix: 2 new pages on each side, pages 1-2 -> slots 4..9
    full = a.alloc_extend(np.array([0]), np.array([6]), np.array([-1]), 6)
    assert ids(full) == [4, 5, 6, 7, 8, 9] and ids(a.full_to_swa_index_mapping[4:10]) == [4, 5, 6, 7, 8, 9]
    assert a.available_size() == min(8, 0) == 0
    assert ids(a.alloc_decode(np.array([7]), np.array([9]))) == [10]  # same page on both sides
    assert ids(a.alloc_decode(np.array([8]), np.array([10]))) == [11]
    # tokens 0-3 (slots 4-7) left the window: SWA page 1 goes back, the full page stays
    a.free_swa(np.array([4, 5, 6, 7]))
    assert ids(a.swa_attn_allocator.free_pages) == [1] and ids(a.full_to_swa_index_mapping[4:8]) == [0, 0, 0, 0]
    # token 8 opens a new page: full page 3 (slot 12), SWA page 1 (slot 4)
    assert ids(a.alloc_decode(np.array([9]), np.array([11]))) == [12] and a.full_to_swa_index_mapping[12] == 4
    a.free(np.arange(4, 13))  # the finished request: SWA pages {2, 1}, full pages {1, 2, 3}, sorted to the front
    assert ids(a.swa_attn_allocator.free_pages) == [1, 2]
    assert ids(a.full_attn_allocator.free_pages) == [1, 2, 3, 4]
    assert a.available_size() == 8 and not a.full_to_swa_index_mapping[:-1].any()
    a.check_integrity()


def test_paged_extend_needs_pages_on_both_sides():
    a = SWATokenToKVPoolAllocator(size=16, size_swa=4, page_size=4)
    assert a.alloc_extend(np.array([0]), np.array([5]), np.array([-1]), 5) is None  # 2 pages, SWA has 1
    assert ids(a.full_attn_allocator.free_pages) == [1, 2, 3, 4]  # nothing taken
