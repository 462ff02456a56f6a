"""The test-host fixture of the L3 tests across hosts (issue 51) lives in the package (`tokenspeed_lit.l3.hosts`, from
nbs/l3/27_hosts.ipynb), where the demo's `--l3-hosts` uses it too; the tests import it from here."""
from tokenspeed_lit.l3.hosts import Hosts, MooncakeOnHosts, hosts_unavailable, drop_between, undrop_between  # noqa: F401
