"""Storage pools, one family per file: request rows, KV storage by attention family, mamba state
(``(layer, indices) <-> bytes``; real buffers only on a torch device)."""
