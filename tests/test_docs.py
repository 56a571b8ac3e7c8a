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


def test_the_layout_section_names_every_module():
    """The README's layout of the code is the tree: every module of src/posemb is named there,
    a sub-package's modules in its entry."""
    import pathlib
    import re

    root = pathlib.Path(__file__).parent.parent
    text = (root / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout of the code", 1)[1].split("\n## ", 1)[0]
    tree = block.split("src/posemb/\n", 1)[1]
    entries = re.split(r"\n(?=  \S)", tree)  # one per top-level name, continuation lines joined
    by_package = {e.split()[0].rstrip("/"): e for e in entries if e.split()}
    missing = []
    for path in sorted((root / "src" / "posemb").rglob("*.py")):
        rel = path.relative_to(root / "src" / "posemb")
        if rel.name == "__init__.py" and len(rel.parts) > 1:
            continue  # a package's __init__ is its entry
        if len(rel.parts) == 1:
            if not re.search(rf"\b{re.escape(rel.name)}\b", tree):
                missing.append(str(rel))
        elif rel.name not in by_package.get(rel.parts[0], ""):
            missing.append(str(rel))
    assert not missing, missing
