"""The README's API tour runs as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})


def test_readme_lists_every_claim():
    from posemb.lesson import claims

    text = README.read_text(encoding="utf-8")
    missing = [c.id for c in claims.CLAIMS if f"(`{c.id}`)" not in text]
    assert not missing


def test_readme_lists_every_hf_family():
    from posemb.hf import families

    text = README.read_text(encoding="utf-8")
    missing = [
        f.name for f in (*families.FAMILIES, families.GENERIC) if f"| {f.name} |" not in text
    ]
    assert not missing
