"""write_req_to_token: new slots land in ``[prefix_len, seq_len)`` of each request's row, nothing else moves."""

import pytest
import torch

from poolsim.kernels.ops.write_req_to_token import naive
from poolsim.pools import ReqToTokenPool
from tests.kernels.utils import DEVICE, assert_bit_equal, fused


def _i(values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def test_naive_hand():
    table = torch.full((4, 6), -1, dtype=torch.int32, device=DEVICE)
    # row 2 keeps a 2-token prefix and extends by 3; row 1 is fresh with 1 token
    naive.write_req_to_token(table, _i([2, 1]), _i([2, 0]), _i([5, 1]), _i([11, 12, 13, 21]))
    expected = [[-1] * 6, [21, -1, -1, -1, -1, -1], [-1, -1, 11, 12, 13, -1], [-1] * 6]
    assert table.tolist() == expected


def test_naive_hand_with_prefix():
    table = torch.full((3, 5), -1, dtype=torch.int32, device=DEVICE)
    naive.write_req_to_token(table, _i([1]), _i([2]), _i([4]), _i([7, 8]), prefix_loc=_i([5, 6]))
    assert table[1].tolist() == [5, 6, 7, 8, -1]
    assert table[0].tolist() == [-1] * 5 and table[2].tolist() == [-1] * 5


def _batch(num_reqs, max_len, pool_rows, with_prefix, loc_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randperm(pool_rows, generator=g)[:num_reqs] + 1  # row 0 is the padding row
    seq = torch.randint(0, max_len + 1, (num_reqs,), generator=g)
    pre = (torch.rand(num_reqs, generator=g) * seq).long() if with_prefix else torch.zeros_like(seq)
    loc = torch.randint(1, 10_000, (int((seq - pre).sum()),), generator=g, dtype=loc_dtype)
    prefix = torch.randint(1, 10_000, (int(pre.sum()),), generator=g) if with_prefix else None
    dev = [t.to(DEVICE) if t is not None else None for t in (rows, pre, seq, loc, prefix)]
    return dev


@pytest.mark.parametrize("num_reqs,max_len,with_prefix,loc_dtype", [
    (1, 7, False, torch.int64), (5, 37, True, torch.int64), (9, 1100, True, torch.int32), (3, 1, False, torch.int32),
], ids=["N1-L7-int64", "N5-L37-prefix-int64", "N9-L1100-prefix-int32", "N3-L1-int32"])
def test_fused(num_reqs, max_len, with_prefix, loc_dtype):
    torch.manual_seed(42)
    pool = ReqToTokenPool(12, max_len, device=DEVICE)
    ref = pool.req_to_token.fill_(-1)  # an unwritten entry reads -1
    out = ref.clone()
    rows, pre, seq, loc, prefix = _batch(num_reqs, max_len, 12, with_prefix, loc_dtype, seed=num_reqs)
    naive.write_req_to_token(ref, rows, pre, seq, loc, prefix)
    fused("write_req_to_token").write_req_to_token(out, rows, pre, seq, loc, prefix)
    assert_bit_equal("req_to_token", ref, out)
    # the reference itself wrote exactly the batch's ranges
    written = (ref != -1).sum().item()
    assert written == int((seq if with_prefix else seq - pre).sum())
    assert (ref[0] == -1).all() and (ref[1:][~torch.isin(torch.arange(1, 13, device=DEVICE), rows)] == -1).all()


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_rejects_bad_batches(impl):
    mod = naive if impl == "naive" else fused("write_req_to_token")
    table = torch.full((4, 6), -1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="exceeds the row length"):
        mod.write_req_to_token(table, _i([1]), _i([0]), _i([7]), _i(list(range(7))))
    with pytest.raises(ValueError, match="out_cache_loc has 2 slots"):
        mod.write_req_to_token(table, _i([1]), _i([0]), _i([3]), _i([1, 2]))
    with pytest.raises(IndexError, match="req_pool_indices"):
        mod.write_req_to_token(table, _i([4]), _i([0]), _i([1]), _i([1]))
    with pytest.raises(ValueError, match="prefix_len > seq_len"):
        mod.write_req_to_token(table, _i([1]), _i([3]), _i([2]), _i([]))
    assert (table == -1).all()
    mod.write_req_to_token(table, _i([]), _i([]), _i([]), _i([]))  # an empty batch is a no-op
    assert (table == -1).all()
