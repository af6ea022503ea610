"""SGLang 0.5.23's ``mem_cache``: who hands out slots (``allocator/``), who holds the bytes (``pool/``), the per-batch
allocation policy (``allocation.py``) and the prefix caches (one module per ``BasePrefixCache`` at this root).
The layer rules are in pools/README.md."""
