"""Compare posemb with transformers on every published config in tests/data/hf_configs.

Prints a Markdown table: per rope type, how many layer kinds of how many published configs were
compared and the worst relative difference of inv_freq (posemb's float64 against transformers'
float32 rotary module), with the bound the tests hold it to. Needs transformers (the test
extra). Run: ``python scripts/hf_config_report.py``.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from posemb import hf  # noqa: E402


def main() -> int:
    """Print the comparison table; exit status 1 if any difference passes its bound."""
    if importlib.util.find_spec("transformers") is None:
        print("hf_config_report: transformers is not installed (pip install -e '.[test]')")
        return 2
    import hf_reference as hr  # the tests' reading of transformers: the same comparison

    files = sorted((ROOT / "tests" / "data" / "hf_configs").glob("*.json"))
    worst: dict[str, float] = defaultdict(float)
    bound: dict[str, float] = defaultdict(float)
    kinds: dict[str, int] = defaultdict(int)
    configs: dict[str, set[str]] = defaultdict(set)
    families = set()
    for path in files:
        d = json.loads(path.read_text(encoding="utf-8"))
        model = hf.model_rope(d)
        families.add(model.family)
        _, ref = hr.hf_frequencies(hr.hf_config(d))
        for kind in model.kinds:
            if kind.spec is None:
                continue
            spec = kind.spec
            want, _ = ref.get(kind.layer_type, ref.get(None))
            inv, _ = spec.scaling.compute(spec.rotary_dim, spec.base)
            # Proportional RoPE leaves pairs unrotated (inv_freq exactly 0 in both).
            rel = float(((inv - want).abs() / want.abs().clamp_min(1e-300)).max())
            worst[spec.rope_type] = max(worst[spec.rope_type], rel)
            bound[spec.rope_type] = max(bound[spec.rope_type], hr.inv_freq_tolerance(spec.base))
            kinds[spec.rope_type] += 1
            configs[spec.rope_type].add(path.name)
    print(f"{len(files)} published configs, {len(families)} posemb family rules\n")
    print("| rope type | configs | layer kinds | worst relative inv_freq difference | bound |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for rt in sorted(worst):
        print(f"| {rt} | {len(configs[rt])} | {kinds[rt]} | {worst[rt]:.2e} | {bound[rt]:.2e} |")
    return 0 if all(worst[rt] <= bound[rt] for rt in worst) else 1


if __name__ == "__main__":
    raise SystemExit(main())
