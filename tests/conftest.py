import os
from hypothesis import settings, HealthCheck

import tokenspeed_lit.core  # noqa: F401  (decides TRITON_INTERPRET before any kernel module imports triton)

# The Triton interpreter is slow (about 1 ms per program): keep example counts CI-sized, no deadline.
settings.register_profile('ci', max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile('gpu', max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get('HYPOTHESIS_PROFILE', 'gpu' if tokenspeed_lit.core.HAS_ACCEL else 'ci'))
