"""Prefill (extend) attention over ``req_to_token``: new tokens attend to their prefix and causally to each other."""
