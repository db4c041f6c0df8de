"""The README's Python examples run as written (every ```python block, in order, one namespace)."""
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.M | re.S)


def test_readme_python_blocks_run(minilm_path, single_thread, capsys):
    blocks = python_blocks()
    assert len(blocks) >= 2
    namespace = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 (the README's own code)
    assert "layer" in capsys.readouterr().out
