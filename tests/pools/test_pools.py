"""Request rows, mamba slots and KV storage sizes, from docs/sglang.md sections 1, 2.4, 3 and 7."""

import pytest

from poolsim.pools import (
    DoubleFreeError,
    HybridLinearKVPool,
    HybridReqToTokenPool,
    MambaCacheParams,
    MambaCapacityError,
    MambaPool,
    MambaSlotAllocator,
    MambaStateShape,
    MHATokenToKVPool,
    MLATokenToKVPool,
    PoolError,
    ReqToTokenPool,
)
from tests.helpers import FakeReq, as_list

KIMI_KDA_LAYERS = [i for i in range(27) if (i + 1) not in (4, 8, 12, 16, 20, 24, 27)]


def kimi_params(tp=1, ssm_dtype="float32"):
    shape = MambaStateShape.kimi_linear(tp=tp, num_heads=32, head_dim=128, conv_kernel_size=4)
    return MambaCacheParams(shape=shape, layers=KIMI_KDA_LAYERS, ssm_dtype=ssm_dtype)


# ---------------------------------------------------------------- ReqToTokenPool
def test_rows_are_lifo_from_the_tail(device):
    p = ReqToTokenPool(5, 16, device=device)
    assert p.req_to_token.shape == (6, 16)  # row 0 is the padding row
    assert p.alloc_rows(2) == [4, 5]
    assert p.alloc_rows(1) == [3]
    p.free_rows([5])
    p.free_rows([4])
    assert p.free_slots == [1, 2, 5, 4]
    assert p.alloc_rows(1) == [4]  # the most recently freed row comes back first
    assert p.alloc_rows(0) == []
    assert p.alloc_rows(4) is None
    assert p.available_size() == 3
    p.check_integrity()


def test_rows_write_and_read(device):
    p = ReqToTokenPool(2, 8, device=device)
    (row,) = p.alloc_rows(1)
    p.write((row, slice(0, 3)), [7, 8, 9])
    assert as_list(p.req_to_token[row, :4]) == [7, 8, 9, 0]
    with pytest.raises(PoolError):
        p.write((row, slice(6, 9)), [1, 2, 3])  # past max_context_len


def test_row_misuse_is_an_error(device):
    p = ReqToTokenPool(3, 4, device=device)
    with pytest.raises(DoubleFreeError):
        p.free_rows([1])
    with pytest.raises(PoolError):
        p.free_rows([0])
    with pytest.raises(PoolError):
        p.free_rows([4])
    with pytest.raises(PoolError):
        ReqToTokenPool(-1, 4, device=device)
    p.check_integrity()


def test_req_to_token_table_bytes():
    # (rows + 1) x max_context_len x int32, outside the KV budget: 2049 x 1M x 4 B ~ 8 GiB
    assert ReqToTokenPool(2048, 1 << 20).table_bytes() == 2049 * (1 << 20) * 4


# ---------------------------------------------------------------- mamba slots
def test_mamba_slots_fifo_and_groups(device):
    a = MambaSlotAllocator(4, device=device)
    assert as_list(a.alloc(2)) == [1, 2]
    a.free([1])
    assert as_list(a.free_slots) == [3, 4, 1]
    a.alloc_group_begin(2)  # pre-takes [3, 4]
    assert a.available_size() == 1
    assert as_list(a.alloc(1)) == [3]
    a.alloc_group_end()  # the unused 4 goes back to the tail
    assert as_list(a.free_slots) == [1, 4]
    a.alloc_group_begin(5)  # more than free: no group, plain allocation
    assert as_list(a.alloc(1)) == [1]
    with pytest.raises(DoubleFreeError):
        a.free([4])
    with pytest.raises(PoolError):
        a.free([0])
    a.check_integrity()


def test_mamba_slot_ids_one_at_a_time_and_the_frees_refused(device):
    a = MambaSlotAllocator(3, device=device)
    assert [a.alloc_one(), a.alloc_one()] == [1, 2]  # the head, as alloc(1) hands it out
    a.free([2])
    a.free(a.alloc(1))  # an array back, as the tree frees
    assert as_list(a.free_slots) == [2, 3]
    a.alloc_group_begin(2)  # pre-takes [2, 3]; alloc_one drains the group first
    assert a.alloc_one() == 2 and a.available_size() == 0
    a.alloc_group_end()  # 3 back to the tail
    assert a.alloc_one() == 3 and a.alloc_one() is None and a.alloc(1) is None
    with pytest.raises(PoolError, match="freeing mamba slot 4 outside 1..3"):
        a.free([3, 4])
    with pytest.raises(PoolError, match="slot 0, the reserved padding"):
        a.free([0])
    with pytest.raises(DoubleFreeError, match="double free of mamba slot 2"):
        a.free([2, 2])  # twice in one call
    a.free([2, 3])
    with pytest.raises(DoubleFreeError, match="double free of mamba slot 3"):
        a.free([1, 3])  # 3 is already free; nothing of the call is freed
    assert as_list(a.free_slots) == [2, 3]
    a.check_integrity()


def test_kimi_linear_state_bytes_per_slot():
    # docs/sglang.md 7.3: conv 3 x 12288 bf16 + temporal 32 x 128 x 128 fp32 per layer, 20 KDA layers
    assert kimi_params().shape.conv == [(3, 12288)]
    assert kimi_params().shape.temporal == (32, 128, 128)
    assert kimi_params(tp=1).mamba_cache_per_req == 43_417_600
    assert kimi_params(tp=2).mamba_cache_per_req == 43_417_600 // 2
    assert kimi_params(tp=8).mamba_cache_per_req == 43_417_600 // 8
    assert kimi_params(ssm_dtype="bfloat16").mamba_cache_per_req == 20 * (36864 * 2 + 524288 * 2)


def test_mamba_pool_allocates_size_plus_one(device):
    pool = MambaPool(2, kimi_params(), device=None)
    assert pool.mem_usage_bytes() == 3 * 43_417_600  # slot 0 is padding
    assert pool.conv_state_bytes() == 3 * 20 * 3 * 12288 * 2
    assert pool.ssm_state_bytes() == 3 * 20 * 32 * 128 * 128 * 4


def test_mamba_pool_buffers_on_torch():
    torch = pytest.importorskip("torch")
    params = MambaCacheParams(shape=MambaStateShape.kimi_linear(tp=1, num_heads=2, head_dim=4), layers=[0, 2])
    pool = MambaPool(3, params, device="cpu")
    assert pool.temporal.shape == (2, 4, 2, 4, 4) and pool.temporal.dtype == torch.float32
    assert pool.conv[0].shape == (2, 4, 3, 24) and pool.conv[0].dtype == torch.bfloat16
    pool.temporal[:, 1] = 5.0
    pool.copy_from([1], [3])
    assert float(pool.temporal[:, 3].min()) == 5.0
    pool.clear_slots([3])
    assert float(pool.temporal[:, 3].abs().max()) == 0.0


def test_hybrid_rows_get_one_mamba_slot_each(device):
    p = HybridReqToTokenPool(4, 8, mamba_size=3, cache_params=kimi_params(), device=device)
    a, b = FakeReq([1]), FakeReq([2])
    assert p.alloc([a, b]) == [3, 4]  # rows LIFO from the tail
    assert (a.kv.mamba_pool_idx, b.kv.mamba_pool_idx) == (1, 2)  # slots FIFO from the head
    assert as_list(p.get_mamba_indices([3, 4])) == [1, 2]
    c = FakeReq([3])
    c.kv.mamba_pool_idx = 2 + 0  # already holds a slot (copy-on-write target): keeps it
    p.mamba_allocator.alloc(1)  # take slot 3 so nothing is left
    assert p.alloc([c]) == [2] and c.kv.mamba_pool_idx == 2
    with pytest.raises(MambaCapacityError):
        p.alloc([FakeReq([4])])
    p.free_mamba_cache(a)
    assert a.kv.mamba_pool_idx is None and p.mamba_pool.available_size() == 1
    with pytest.raises(PoolError):
        p.free_mamba_cache(a)


def test_hybrid_extra_buffer_tracking_slots(device):
    p = HybridReqToTokenPool(4, 8, mamba_size=8, cache_params=kimi_params(), device=device,
                             mamba_ping_pong_track_buffer_size=2)
    a = FakeReq([1])
    p.alloc([a])
    # working slot 1, then two ping-pong slots 2, 3; the first checkpoint goes to position 0
    assert a.kv.mamba_pool_idx == 1 and a.kv.mamba_ping_pong_track_buffer == [2, 3]
    assert (a.kv.mamba_next_track_idx, a.kv.mamba_last_track_idx) == (0, 1)
    p.free_mamba_cache(a, keep_idx=1)  # slot 3 was donated to the tree
    assert as_list(p.mamba_allocator.free_slots) == [4, 5, 6, 7, 8, 1, 2]


# ---------------------------------------------------------------- KV storage
def test_mha_sizes_match_sglang_log_llama_8b():
    # Llama-3.1-8B, 32 layers x 8 KV heads x 128, bf16: SGLang logs
    # "KV Cache is allocated. #tokens: 442750, K size: 27.02 GB, V size: 27.02 GB"
    pool = MHATokenToKVPool(442750, 1, "bfloat16", head_num=8, head_dim=128, layer_num=32)
    k, v = pool.get_kv_size_bytes()
    assert k == v == 32 * 442751 * 8 * 128 * 2  # size + page_size rows
    assert f"{k / 2**30:.2f}" == "27.02"
    assert pool.cell_size_bytes() == 8 * 256 * 32 * 2


def test_mha_fp8_and_paged_padding_rows():
    pool = MHATokenToKVPool(1024, 16, "fp8_e4m3", head_num=1, head_dim=128, layer_num=80)
    assert pool.get_kv_size_bytes() == (80 * 1040 * 128, 80 * 1040 * 128)  # fp8 = 1 byte; rows = size + 16


def test_mla_sizes_not_split_by_tp():
    pool = MLATokenToKVPool(1000, 1, "bfloat16", kv_lora_rank=512, qk_rope_head_dim=64, layer_num=61)
    assert pool.get_kv_size_bytes() == 61 * 1001 * 576 * 2
    assert pool.cell_size_bytes() == 576 * 61 * 2
    fp8 = MLATokenToKVPool(1000, 1, "fp8_e4m3", 512, 64, 61)
    assert fp8.get_kv_size_bytes() == 61 * 1001 * 576


def test_hybrid_pool_counts_full_attention_layers_only():
    mamba = MambaPool(4, kimi_params())
    pool = HybridLinearKVPool(1000, 1, "bfloat16", [3, 7, 11, 15, 19, 23, 26], mamba, use_mla=True,
                              kv_lora_rank=512, qk_rope_head_dim=64)
    assert pool.cell_size_bytes() == 8064  # (512 + 64) x 7 x 2 B
    assert pool.get_kv_size_bytes() == 8064 * 1001
    assert pool.dense_layer(26) == 6
    with pytest.raises(PoolError):
        pool.dense_layer(0)  # a KDA layer has no KV


def test_torch_kv_buffers_have_the_logged_shapes():
    torch = pytest.importorskip("torch")
    mha = MHATokenToKVPool(12, 4, "float16", head_num=2, head_dim=8, layer_num=3, device="cpu", v_head_dim=4)
    assert len(mha.k_buffer) == 3 and tuple(mha.k_buffer[0].shape) == (16, 2, 8)
    assert tuple(mha.v_buffer[0].shape) == (16, 2, 4)
    k, v = mha.get_kv_size_bytes()
    assert k == sum(b.numel() * b.element_size() for b in mha.k_buffer)
    mla = MLATokenToKVPool(10, 1, "fp8_e4m3", 16, 8, 2, device="cpu")
    assert mla.kv_buffer[0].dtype == torch.uint8 and tuple(mla.kv_buffer[0].shape) == (11, 1, 24)
    assert mla.get_kv_size_bytes() == sum(b.numel() * b.element_size() for b in mla.kv_buffer)


def test_decode_write_scatters_one_slot_per_request_and_never_spills_into_the_next_row(device):
    from poolsim.pools.mem_cache.req_kv import ReqKvInfo

    pool = ReqToTokenPool(3, 8, device=device)
    a, b = ReqKvInfo(), ReqKvInfo()
    a.req_pool_idx, a.kv_committed_len = 2, 5
    b.req_pool_idx, b.kv_committed_len = 1, 7
    pool.write_decode([a, b], [41, 42])
    table = pool.req_to_token.tolist()
    assert table[2][5] == 41 and table[1][7] == 42
    assert sum(v != 0 for row in table for v in row) == 2
    b.kv_committed_len = 8  # flat position 1 * 8 + 8 is row 2's first slot: refused, not written there
    with pytest.raises(PoolError, match="max_context_len 8"):
        pool.write_decode([b], [43])
    b.req_pool_idx = None
    with pytest.raises(PoolError, match="holds no row"):
        pool.write_decode([b], [43])
    assert pool.req_to_token.tolist()[2][0] == 0


def test_decode_writes_land_where_each_request_stands_whether_or_not_the_batch_is_the_previous_one(device):
    # write_decode reuses the previous write's positions plus one only when every request was in it at the same
    # index; every other batch (reordered, a request swapped in, one that skipped a step or changed rows) is
    # written from the requests themselves. Positions by hand: row * 16 + kv_committed_len.
    from poolsim.pools.mem_cache.req_kv import ReqKvInfo

    pool = ReqToTokenPool(4, 16, device=device)
    a, b, c = ReqKvInfo(), ReqKvInfo(), ReqKvInfo()
    a.req_pool_idx, a.kv_committed_len = 1, 3
    b.req_pool_idx, b.kv_committed_len = 2, 9
    c.req_pool_idx, c.kv_committed_len = 3, 0

    def step(kvs, values):
        pool.write_decode(kvs, values)
        for kv in kvs:
            kv.kv_committed_len += 1

    step([a, b], [10, 20])  # a -> (1, 3), b -> (2, 9)
    step([a, b], [11, 21])  # the same batch one on: (1, 4), (2, 10)
    step([b, a], [22, 12])  # reordered: (2, 11), (1, 5)
    step([a, c], [13, 30])  # b swapped for c, same size: (1, 6), (3, 0)
    a.kv_committed_len += 1  # a skipped a step
    step([a, c], [14, 31])  # (1, 8), (3, 1)
    c.req_pool_idx = 4  # c's row changed at the same length
    step([a, c], [15, 32])  # (1, 9), (4, 2)
    step([a, c], [16, 33])  # the same batch one on: (1, 10), (4, 3)
    step([a], [17])  # shorter: (1, 11)
    with pytest.raises(PoolError, match="holds no row"):
        pool.write_decode([c, ReqKvInfo()], [0, 0])  # c is stamped before the row-less request raises
    step([a], [18])  # (1, 12)
    c.kv_committed_len += 1
    step([c], [34])  # (4, 5); its stamp from the failed write must not pass for the previous write's
    table = pool.req_to_token.tolist()
    written = {(r, p): v for r, row in enumerate(table) for p, v in enumerate(row) if v}
    assert written == {(1, 3): 10, (1, 4): 11, (1, 5): 12, (1, 6): 13, (1, 8): 14, (1, 9): 15, (1, 10): 16,
                       (1, 11): 17, (1, 12): 18, (2, 9): 20, (2, 10): 21, (2, 11): 22, (3, 0): 30, (3, 1): 31,
                       (4, 2): 32, (4, 3): 33, (4, 5): 34}
    pool.clear()  # a fresh pool state: the next write reads its requests again
    a.req_pool_idx, a.kv_committed_len = 2, 0
    step([a], [40])
    assert pool.req_to_token.tolist()[2][0] == 40
