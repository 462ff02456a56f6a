"""Real Mooncake servers for the L3 tests: a master and a store process on free 127.0.0.1 ports, stopped by pid."""
import pytest

mooncake_missing = pytest.mark.skipif(
    not __import__('tokenspeed_lit.l3.store', fromlist=['mooncake_available']).mooncake_available(),
    reason='Mooncake Store is not installed (pip install -e .[l3])')


@pytest.fixture
def mooncake():
    "A fresh master and store process for one test (stopped by pid when the test ends, passed or failed)."
    from tokenspeed_lit.l3.servers import LocalMooncake
    srv = LocalMooncake(segment_bytes=64 << 20)
    try: yield srv
    finally:
        srv.stop()
        assert srv.pids == []


@pytest.fixture(scope='module')
def shared_mooncake():
    "One master and store process for a whole test module (the tests that do not stop them)."
    from tokenspeed_lit.l3.servers import LocalMooncake
    srv = LocalMooncake(segment_bytes=128 << 20)
    try: yield srv
    finally: srv.stop()
