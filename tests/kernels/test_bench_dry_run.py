"""bench/kernels_gpu.py end to end in --dry-run mode (tiny fp32 shapes, interpreter), so the GPU script does not rot."""

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.kernels.utils import ON_GPU

ROOT = Path(__file__).resolve().parents[2]


def _load_bench():
    spec = importlib.util.spec_from_file_location("kernels_gpu", ROOT / "bench" / "kernels_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules["kernels_gpu"] = bench  # dataclasses look their module up there
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")  # fla-core on a CPU
@pytest.mark.skipif(ON_GPU, reason="on a GPU run the real benchmark; --dry-run needs the interpreter")
def test_bench_dry_run(tmp_path):
    pytest.importorskip("triton")
    bench = _load_bench()
    assert bench.main(["--dry-run", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "kernels_gpu.md").read_text()
    assert "FAIL" not in table and "times are NOT performance numbers" in table
    for kernel in ("kda_decode", "conv1d_update", "decode_attention gqa", "decode_attention mla", "store_kv gqa",
                   "store_mla_kv", "write_req_to_token", "kda_prefill"):
        assert f"| {kernel}" in table, kernel
    rows = (tmp_path / "kernels_gpu.csv").read_text().splitlines()
    assert rows[0].startswith("kernel,shape,batch,seconds,bytes") and len(rows) > 20


def test_bench_refuses_without_cuda(capsys):
    if ON_GPU:
        pytest.skip("has CUDA")
    bench = _load_bench()
    assert bench.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err
