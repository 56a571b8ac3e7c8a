"""A helper the lesson's figure tests share: every dict inside a Vega-Lite spec."""


def walk(node):
    """Every dict inside a JSON-like value, depth first."""
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)
