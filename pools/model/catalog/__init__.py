"""Bundled Hugging Face config.json files (see README.md); a package so the wheel ships them."""
