"""pools/README.md's layer rules: imports go down the stack, and pools/ never reaches the simulator, the reports,
the kernels or the CLI."""

import ast
from pathlib import Path

POOLS = Path(__file__).resolve().parents[2] / "pools"
LEAVES = {"errors", "dtypes", "backend", "hardware"}
ALLOWED = {  # layer -> the layers it may import (besides itself)
    "errors": set(), "dtypes": set(), "backend": set(), "hardware": set(),
    "mem_cache/allocator": {"backend", "errors"},
    "mem_cache/pool": {"mem_cache/allocator", "mem_cache/req_kv", "backend", "dtypes", "errors"},
    "mem_cache/pool_host": {"mem_cache/pool", "backend", "dtypes", "errors"},
    "mem_cache": {"mem_cache/pool", "mem_cache/pool_host", "mem_cache/allocator", "mem_cache/req_kv", *LEAVES},
    "mem_cache/req_kv": set(),
    "model": {"mem_cache/pool", "dtypes"},
    "sizing": {"model", "hardware", "mem_cache/pool", "mem_cache/pool_host", *LEAVES},
    "pools": {"mem_cache", "mem_cache/pool", "mem_cache/allocator", "mem_cache/req_kv", "sizing", *LEAVES},
}


def layer(module: str) -> str:
    """``poolsim.pools.mem_cache.pool.mha`` -> ``mem_cache/pool``; outside pools: the top-level folder."""
    parts = module.split(".")
    if parts[:2] != ["poolsim", "pools"]:
        return parts[1] if len(parts) > 1 else parts[0]
    rest = parts[2:]
    if not rest:
        return "pools"
    if rest[0] == "mem_cache" and len(rest) > 1 and rest[1] in ("allocator", "pool", "pool_host", "req_kv"):
        return "mem_cache/" + rest[1]
    return rest[0]


def test_every_pools_import_goes_down_the_layers():
    broken = []
    files = sorted(POOLS.rglob("*.py"))
    assert len(files) > 40
    for path in files:
        module = "poolsim." + ".".join(path.relative_to(POOLS.parent).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        me = layer(module)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "poolsim":
                target = layer(node.module)
                if target != me and target not in ALLOWED[me]:
                    broken.append(f"{path.relative_to(POOLS.parent)}:{node.lineno}: {me} imports {node.module}")
    assert broken == []


def test_the_layer_map_names_real_folders():
    assert layer("poolsim.pools.mem_cache.pool.mha") == "mem_cache/pool"
    assert layer("poolsim.pools.mem_cache.radix_cache") == "mem_cache"
    assert layer("poolsim.sim.scheduler") == "sim"
    for name in ALLOWED:
        if name != "pools":
            assert (POOLS / name).is_dir() or (POOLS / f"{name}.py").is_file(), name
