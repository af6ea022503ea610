"""Random operation sequences: the allocators against a plain-list oracle of SGLang's semantics,
numpy against torch, and check_integrity() after every step."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from poolsim.pools import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from tests.conftest import HAS_TORCH
from tests.helpers import as_list


class ListOracle:
    """SGLang's free-list semantics written the obvious way: one Python list, rebuilt on every call."""

    def __init__(self, size, page_size, need_sort):
        self.ps, self.need_sort = page_size, need_sort
        self.free_pages = list(range(1, size // page_size + 1))
        self.staged = []

    def available(self):
        return (len(self.free_pages) + len(self.staged)) * self.ps

    def merge(self):
        if self.staged:
            self.free_pages = sorted(self.free_pages + self.staged)
            self.staged = []

    def _take(self, n):
        out, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return out

    def alloc(self, n):
        pages = n // self.ps
        if self.need_sort and pages > len(self.free_pages):
            self.merge()
        if pages > len(self.free_pages):
            return None
        return [p * self.ps + i for p in self._take(pages) for i in range(self.ps)]

    def free(self, idx):
        if self.ps == 1:
            pages = list(idx)
        else:
            pages = sorted(set(i // self.ps for i in idx))
        if self.need_sort:
            self.staged += pages
        elif self.ps == 1:
            self.free_pages = self.free_pages + pages
        else:
            self.free_pages = pages + self.free_pages

    def alloc_decode(self, seq_lens, last_loc):
        if len(seq_lens) > len(self.free_pages):
            self.merge()
        need = [(s - 1) % self.ps == 0 for s in seq_lens]
        if sum(need) > len(self.free_pages):
            return None
        new = iter(self._take(sum(need)))
        return [next(new) * self.ps if n else l + 1 for n, l in zip(need, last_loc)]

    def alloc_extend(self, prefix_lens, seq_lens, last_loc):
        ps = self.ps
        ext = sum(s - p for p, s in zip(prefix_lens, seq_lens))
        if ext // ps + len(seq_lens) + 1 > len(self.free_pages):
            self.merge()
        need = sum(-(-s // ps) - -(-p // ps) for p, s in zip(prefix_lens, seq_lens))
        if need > len(self.free_pages):
            return None
        pages = iter(self._take(need))
        out = []
        for p, s, last in zip(prefix_lens, seq_lens, last_loc):
            page = None
            for pos in range(p, s):
                if pos < -(-p // ps) * ps:
                    out.append(last + 1 + pos - p)
                else:
                    if pos % ps == 0:
                        page = next(pages)
                    out.append(page * ps + pos % ps)
        return out


def make(device, size, ps, need_sort):
    if ps == 1:
        return TokenToKVPoolAllocator(size, need_sort=need_sort, device=device)
    return PagedTokenToKVPoolAllocator(size, ps, need_sort=need_sort, device=device)


def run_script(seed, ps, need_sort, devices, steps=60):
    """Drive requests that grow by extend/decode and finish; compare every returned index list."""
    rng = random.Random(seed)
    size = 64 * ps
    allocs = [make(d, size, ps, need_sort) for d in devices]
    oracle = ListOracle(size, ps, need_sort)
    live = []  # (slots, seq_len) per request
    for _ in range(steps):
        op = rng.random()
        if op < 0.35 and ps > 1:  # batch extend of new and continuing requests
            batch = []
            for _ in range(rng.randint(1, 3)):
                if live and rng.random() < 0.4:
                    i = rng.randrange(len(live))
                    slots, n = live.pop(i)
                    batch.append((slots, n, n + rng.randint(1, 3 * ps)))
                else:
                    batch.append(([], 0, rng.randint(1, 3 * ps)))
            pre = [b[1] for b in batch]
            seq = [b[2] for b in batch]
            last = [b[0][-1] if b[0] else -1 for b in batch]
            want = oracle.alloc_extend(pre, seq, last)
            for a in allocs:
                assert as_list(a.alloc_extend(pre, seq, last, sum(s - p for p, s in zip(pre, seq)))) == want
            if want is None:
                live += [(b[0], b[1]) for b in batch if b[1]]
                continue
            it = iter(want)
            for slots, p, s in batch:
                live.append((slots + [next(it) for _ in range(s - p)], s))
        elif op < 0.55 and live and ps > 1:  # decode step for every live request
            seq = [n + 1 for _, n in live]
            last = [slots[-1] for slots, _ in live]
            want = oracle.alloc_decode(seq, last)
            for a in allocs:
                assert as_list(a.alloc_decode(seq, last)) == want
            if want is not None:
                live = [(slots + [w], n + 1) for (slots, n), w in zip(live, want)]
        elif op < 0.75:  # page-aligned plain alloc
            n = rng.randint(0, 8) * ps
            want = oracle.alloc(n)
            for a in allocs:
                assert as_list(a.alloc(n)) == want
            if want:
                live.append((want, n))
        elif live:  # finish a request
            slots, _ = live.pop(rng.randrange(len(live)))
            oracle.free(slots)
            for a in allocs:
                a.free(slots)
        for a in allocs:
            assert a.available_size() == oracle.available()
            a.check_integrity()
    for slots, _ in live:
        oracle.free(slots)
        for a in allocs:
            a.free(slots)
    oracle.merge()
    for a in allocs:
        a.merge_and_sort_free()
        assert a.available_size() == size
        assert as_list(a.free_pages) == oracle.free_pages
    return oracle.free_pages


DEVICES = [None, "cpu"] if HAS_TORCH else [None]


@pytest.mark.parametrize("ps", [1, 4, 16])
@pytest.mark.parametrize("need_sort", [False, True])
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_scripts_match_oracle_on_both_backends(ps, need_sort, seed):
    final = run_script(seed, ps, need_sort, DEVICES)  # compares every returned index list along the way
    assert sorted(final) == list(range(1, 64 + 1))  # everything came back, each page once
