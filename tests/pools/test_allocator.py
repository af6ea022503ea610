"""Token->KV allocators against index lists derived by hand from docs/sglang.md section 2."""

import pytest

from poolsim.pools import DoubleFreeError, PagedTokenToKVPoolAllocator, PoolError, TokenToKVPoolAllocator
from tests.helpers import as_list


# ---------------------------------------------------------------- page size 1
def test_page1_fifo_order(device):
    a = TokenToKVPoolAllocator(8, device=device)
    assert as_list(a.free_pages) == [1, 2, 3, 4, 5, 6, 7, 8]  # slot 0 is never handed out
    assert as_list(a.alloc(3)) == [1, 2, 3]
    assert as_list(a.alloc(2)) == [4, 5]
    a.free([2, 1])  # appended at the tail, in the given order
    assert as_list(a.free_pages) == [6, 7, 8, 2, 1]
    assert a.available_size() == 5
    assert as_list(a.alloc(4)) == [6, 7, 8, 2]
    assert a.alloc(2) is None  # short: None, nothing taken
    assert a.available_size() == 1
    assert as_list(a.alloc(0)) == []
    a.check_integrity()


def test_page1_need_sort_stages_until_short(device):
    a = TokenToKVPoolAllocator(8, need_sort=True, device=device)
    assert as_list(a.alloc(3)) == [1, 2, 3]
    a.free([3, 1])
    assert as_list(a.release_pages) == [3, 1]
    assert as_list(a.free_pages) == [4, 5, 6, 7, 8]
    assert a.available_size() == 7  # staged slots count as available
    assert as_list(a.alloc(5)) == [4, 5, 6, 7, 8]  # 5 <= len(free_pages): no merge
    assert as_list(a.release_pages) == [3, 1]
    assert as_list(a.alloc(1)) == [1]  # short -> merge and sort ascending -> [1, 3]
    assert as_list(a.free_pages) == [3]
    assert as_list(a.release_pages) == []
    a.check_integrity()


def test_page1_merge_and_sort_free(device):
    a = TokenToKVPoolAllocator(6, need_sort=True, device=device)
    a.alloc(6)
    a.free([5, 2])
    a.free([4])
    a.merge_and_sort_free()
    assert as_list(a.free_pages) == [2, 4, 5]
    assert a.available_size() == 3


def test_page1_free_group(device):
    a = TokenToKVPoolAllocator(6, device=device)
    a.alloc(4)
    a.free_group_begin()
    a.free([3])
    a.free([1, 2])
    assert a.available_size() == 2  # deferred until the group ends
    a.free_group_end()
    assert as_list(a.free_pages) == [5, 6, 3, 1, 2]
    with pytest.raises(PoolError):
        a.free_group_begin()
        a.free_group_begin()  # nested


def test_page1_clear(device):
    a = TokenToKVPoolAllocator(4, device=device)
    a.alloc(3)
    a.clear()
    assert as_list(a.free_pages) == [1, 2, 3, 4]


@pytest.mark.parametrize("bad,err", [([1], DoubleFreeError), ([0], PoolError), ([9], PoolError)])
def test_page1_misuse_is_an_error(device, bad, err):
    a = TokenToKVPoolAllocator(8, device=device)
    a.alloc(0)
    with pytest.raises(err):
        a.free(bad)  # slot 1 was never allocated; 0 is the padding slot; 9 is out of range
    a.check_integrity()  # nothing was corrupted


def test_negative_sizes_are_errors(device):
    with pytest.raises(PoolError):
        TokenToKVPoolAllocator(-1, device=device)
    with pytest.raises(PoolError):
        TokenToKVPoolAllocator(8, device=device).alloc(-1)
    with pytest.raises(PoolError):
        PagedTokenToKVPoolAllocator(32, 3, device=device)  # not a power of two


# ---------------------------------------------------------------- paged
def test_paged_alloc_expands_pages(device):
    a = PagedTokenToKVPoolAllocator(32, 4, device=device)  # pages 1..8
    assert as_list(a.free_pages) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert as_list(a.alloc(8)) == [4, 5, 6, 7, 8, 9, 10, 11]
    assert a.available_size() == 24
    with pytest.raises(PoolError):
        a.alloc(6)  # not page-aligned
    assert a.alloc(28) is None


def test_paged_alloc_extend_three_phases(device):
    """A prefix of 6 tokens on pages 1-2 (last slot 9) extends to 13 tokens."""
    a = PagedTokenToKVPoolAllocator(32, 4, device=device)
    a.alloc(8)  # pages 1, 2
    out = a.alloc_extend(prefix_lens=[6], seq_lens=[13], last_loc=[9], extend_num_tokens=7)
    # phase 1: positions 6, 7 fill the prefix's page after slot 9 -> 10, 11
    # phase 2: positions 8..11 take a whole new page (3) -> 12..15
    # phase 3: position 12 takes one more page (4) -> 16
    assert as_list(out) == [10, 11, 12, 13, 14, 15, 16]
    assert as_list(a.free_pages) == [5, 6, 7, 8]  # ceil(13/4) - ceil(6/4) = 2 pages consumed


def test_paged_alloc_extend_batch_consumes_pages_in_order(device):
    a = PagedTokenToKVPoolAllocator(64, 4, device=device)  # pages 1..16
    out = a.alloc_extend(prefix_lens=[0, 0, 2], seq_lens=[5, 3, 9], last_loc=[-1, -1, 41],
                         extend_num_tokens=5 + 3 + 7)
    # req 0: 5 tokens -> page 1 (4..7), page 2 (8)
    # req 1: 3 tokens -> page 3 (12..14)
    # req 2: prefix 2 on the page of slot 41 (page 10): positions 2,3 -> 42, 43; then page 4 (16..19), page 5 (20)
    assert as_list(out) == [4, 5, 6, 7, 8, 12, 13, 14, 42, 43, 16, 17, 18, 19, 20]
    assert as_list(a.free_pages)[:3] == [6, 7, 8]


def test_paged_alloc_extend_within_the_prefix_page(device):
    a = PagedTokenToKVPoolAllocator(16, 4, device=device)
    out = a.alloc_extend(prefix_lens=[1], seq_lens=[3], last_loc=[8], extend_num_tokens=2)
    assert as_list(out) == [9, 10]  # no new page
    assert a.available_size() == 16


def test_paged_alloc_extend_short_returns_none(device):
    a = PagedTokenToKVPoolAllocator(16, 4, device=device)  # 4 pages
    assert a.alloc_extend([0], [17], [-1], 17) is None  # needs 5 pages
    assert a.available_size() == 16


def test_paged_decode_crosses_a_page_boundary(device):
    a = PagedTokenToKVPoolAllocator(32, 4, device=device)
    a.alloc(16)  # pages 1..4
    # Request A has 4 tokens on page 1 (slots 4..7); request B has 6 tokens, last slot 9.
    out = a.alloc_decode(seq_lens=[5, 7], last_loc=[7, 9])
    assert as_list(out) == [20, 10]  # A: 5 % 4 == 1 -> new page 5; B: slot after 9
    assert as_list(a.free_pages) == [6, 7, 8]
    assert a.alloc_decode(seq_lens=[9, 9, 9, 9], last_loc=[27, 27, 27, 27]) is None  # 4 new pages, 3 free


def test_paged_free_prepends_sorted_unique_pages(device):
    a = PagedTokenToKVPoolAllocator(32, 4, device=device)
    a.alloc(32)
    a.free([29, 30, 5, 6])  # pages 7 and 1 -> unique sorted [1, 7], prepended
    assert as_list(a.free_pages) == [1, 7]
    a.free([12])  # page 3, prepended: freed pages are reused first (LIFO)
    assert as_list(a.free_pages) == [3, 1, 7]
    assert as_list(a.alloc(4)) == [12, 13, 14, 15]
    a.check_integrity()


def test_paged_free_page_ids_and_segments_keep_order(device):
    a = PagedTokenToKVPoolAllocator(32, 4, device=device)
    a.alloc(32)
    a.free_page_ids([6, 2])  # exactly these pages, in this order
    assert as_list(a.free_pages) == [6, 2]
    with pytest.raises(DoubleFreeError):
        a.free_segment([20, 21, 22, 23, 8, 9], start_pos=0)  # [::4] -> pages [5, 2]; page 2 is free
    assert as_list(a.free_pages) == [6, 2]  # the failed free changed nothing
    a2 = PagedTokenToKVPoolAllocator(32, 4, device=device)
    a2.alloc(32)
    a2.free_segment([20, 21, 22, 23, 16, 17], start_pos=4)
    assert as_list(a2.free_pages) == [5, 4]
    with pytest.raises(PoolError):
        a2.free_segment([24], start_pos=3)


def test_paged_double_free_is_an_error(device):
    a = PagedTokenToKVPoolAllocator(32, 4, device=device)
    a.alloc(8)
    a.free([4, 5])
    with pytest.raises(DoubleFreeError):
        a.free([6])  # page 1 again
    with pytest.raises(DoubleFreeError):
        a.free_page_ids([2, 2])
    with pytest.raises(PoolError):
        a.free([2])  # page 0
    a.check_integrity()


def test_paged_need_sort_stages_and_merges(device):
    a = PagedTokenToKVPoolAllocator(32, 4, need_sort=True, device=device)
    a.alloc(24)  # pages 1..6
    a.free([20])  # page 5 staged
    a.free([4, 8])  # pages 1, 2 staged
    assert as_list(a.free_pages) == [7, 8]
    assert a.available_size() == 20
    assert as_list(a.alloc(8)) == [28, 29, 30, 31, 32, 33, 34, 35]  # pages 7, 8: enough, no merge
    assert as_list(a.alloc(4)) == [4, 5, 6, 7]  # short -> merge+sort [1, 2, 5] -> page 1
    assert as_list(a.free_pages) == [2, 5]
    a.check_integrity()


def test_paged_extend_merges_on_the_upper_bound(device):
    """SGLang merges when extend//ps + bs + 1 > len(free_pages), even if the exact count fits."""
    a = PagedTokenToKVPoolAllocator(32, 4, need_sort=True, device=device)
    a.alloc(24)  # pages 1..6; free [7, 8]
    a.free([4])  # page 1 staged
    out = a.alloc_extend([0], [4], [-1], 4)  # bound 4//4 + 1 + 1 = 3 > 2 -> merge -> [1, 7, 8]
    assert as_list(out) == [4, 5, 6, 7]
    assert as_list(a.free_pages) == [7, 8]


def test_paged_free_group_flushes_page_ids_after_tokens(device):
    a = PagedTokenToKVPoolAllocator(32, 4, device=device)
    a.alloc(32)
    a.free_group_begin()
    a.free([8, 9])  # page 2
    a.free_page_ids([6])
    a.free([4, 9])  # pages 1, 2 again: the group's cat + unique dedups token frees
    assert a.available_size() == 0
    a.free_group_end()
    # token frees first: unique([2, 1]) = [1, 2] prepended; then the page-id group [6] prepended
    assert as_list(a.free_pages) == [6, 1, 2]
    a.check_integrity()


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("need_sort", [False, True])
def test_full_cycle_restores_capacity(device, page_size, need_sort):
    cls = TokenToKVPoolAllocator if page_size == 1 else PagedTokenToKVPoolAllocator
    kwargs = {} if page_size == 1 else {"page_size": page_size}
    a = cls(64, need_sort=need_sort, device=device, **kwargs)
    got = a.alloc(32)
    assert as_list(got) == list(range(page_size, page_size + 32))
    a.free(got)
    assert a.available_size() == 64
    a.merge_and_sort_free()  # a no-op without need_sort: nothing is staged
    n = 64 // page_size
    if page_size == 1 and not need_sort:
        assert as_list(a.free_pages) == list(range(33, 65)) + list(range(1, 33))  # FIFO: freed slots queue last
    else:
        assert as_list(a.free_pages) == list(range(1, n + 1))  # paged frees prepend; need_sort sorts
    a.check_integrity()


@pytest.mark.parametrize("need_sort", [False, True])
def test_page16_extend_decode_and_free(device, need_sort):
    """Page 16, pool of 64 tokens = pages 1..4 (page 0 reserved)."""
    a = PagedTokenToKVPoolAllocator(64, 16, need_sort=need_sort, device=device)
    # a 20-token prompt: page 1 whole (16..31), page 2 for the 4-token remainder (32..35)
    out = a.alloc_extend([0], [20], [-1], 20)
    assert as_list(out) == list(range(16, 32)) + [32, 33, 34, 35]
    # decode to 21: 21 % 16 != 1, the slot after 35; to 33 would need a new page
    assert as_list(a.alloc_decode([21], [35])) == [36]
    assert a.available_size() == 32
    # a second request whose 3-token prefix ends at slot 50 (page 3) extends to 19 tokens: phase 1 fills
    # 51..63 (13 tokens up to the page end), phase 3 puts the last 3 on the next free page, 4 (64, 65, 66)
    a.alloc(16)  # take page 3 for that prefix
    out = a.alloc_extend([3], [19], [50], 16)
    assert as_list(out) == list(range(51, 64)) + [64, 65, 66]
    assert a.available_size() == 0
    a.free([36, 16])  # pages 2 and 1: unique sorted [1, 2]
    if need_sort:
        assert as_list(a.free_pages) == [] and a.available_size() == 32
        assert as_list(a.alloc(16)) == list(range(16, 32))  # short -> merge and sort -> page 1 first
    else:
        assert as_list(a.free_pages) == [1, 2]
    a.check_integrity()
