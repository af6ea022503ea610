"""What a model is to the pools: its shapes read from a Hugging Face ``config.json`` (``config.py``), one parser per
architecture family (``families/``) and the bundled catalog of configs (``catalog/``)."""
