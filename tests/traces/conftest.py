"""Paths to the real traces: the full files beside the repo (skipped when absent) and the slices copied here."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
SHARED = REPO / ".." / "shared" / "traces"
MOONCAKE_HEAD = DATA / "mooncake_conversation_head400.jsonl"
AZURE_HEAD = DATA / "azure2023_conv_head500.csv"


def shared_file(name: str) -> Path:
    path = SHARED / name
    if not path.is_file():
        pytest.skip(f"{path} is not here (the full real traces live beside the repo)")
    return path


@pytest.fixture
def write(tmp_path):
    """write(text_or_bytes, name) -> path of a file holding it."""

    def _write(content, name="trace.jsonl"):
        path = tmp_path / name
        if isinstance(content, str):
            content = content.encode("utf-8")
        path.write_bytes(content)
        return path

    return _write
