import os

from hypothesis import HealthCheck, settings

# A fixed, modest budget keeps the whole suite under a few minutes on 2 cores and makes CI
# failures reproducible (derandomize) rather than flaky.
settings.register_profile(
    "posemb",
    max_examples=int(os.environ.get("POSEMB_HYPOTHESIS_EXAMPLES", "40")),
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("posemb")
