"""Write a batch's newly allocated KV slots into its ``req_to_token`` rows (SGLang ``write_cache_indices``)."""
