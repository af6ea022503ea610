"""Write new tokens' K/V (MHA/GQA) or MLA latent rows into the KV pool buffers at ``out_cache_loc``."""
