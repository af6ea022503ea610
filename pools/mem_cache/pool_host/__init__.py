"""HiCache's host pools (SGLang's ``srt/mem_cache/pool_host/``), one family per file: sizes, SGLang's warning and
refusal, and the slot allocator the host tier of the radix cache draws from."""
