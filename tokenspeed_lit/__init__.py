__version__ = "0.1.0"

# The one file nbdev does not generate (it keeps only the version line up to date). Importing the package loads
# `host_transport`, whose GPU transports register themselves in `host_mirror.TRANSPORTS`: the mirror never imports
# its transports, so the dependency runs one way (see 06_host_mirror, "_transport_class").
from . import host_transport as _host_transport  # noqa: F401  (registers 'zero_copy' and 'staged')
