"""TEST DOUBLE of NetApp ONTAP's REST API (HTTPS, basic auth), for tests only.

`Cluster` is the in-memory cluster (loaded from a state file in `states/`), `OntapRestDouble`
serves it over HTTPS in a thread, `make_test_pki` makes the test CA it is served with.
"""

from pathlib import Path

from .api import Cluster
from .server import OntapRestDouble
from .tls import DoublePki, make_test_pki

STATES = Path(__file__).parent / "states"

__all__ = ["STATES", "Cluster", "DoublePki", "OntapRestDouble", "make_test_pki"]
