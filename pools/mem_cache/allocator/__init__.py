"""Slot allocators, one family per file (SGLang 0.5.23 ``mem_cache/allocator/``): ``need_size -> indices``."""
