"""Decode attention over paged KV through ``req_to_token``: MHA/GQA and MLA (absorbed), split-K."""
