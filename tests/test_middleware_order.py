"""The gateway's middleware runs in the order gateway/middleware/__init__.py documents, outermost first:
x-replica-id around everything (the 500 handler included), then metrics, audit, auth, admission (after auth
and audit: an unknown key is 401 and an admin attempt audited whatever the server's state), quotas and the
body caps nearest the routes."""
from gateway.app import create_app
from gateway.middleware.admission import Admit
from gateway.middleware.audit import Audit
from gateway.middleware.auth import Authenticate
from gateway.middleware.body_limits import CapBodies
from gateway.middleware.metrics import Measure
from gateway.middleware.quotas import Quotas
from gateway.middleware.replica_id import ReplicaId
from gateway.settings import Settings
from starlette.middleware.errors import ServerErrorMiddleware

OURS = (ReplicaId, ServerErrorMiddleware, Measure, Audit, Authenticate, Admit, Quotas, CapBodies)


def test_the_stack_runs_in_the_documented_order(tmp_path):
    node, seen = create_app(Settings(data_dir=tmp_path)).build_middleware_stack(), []
    while node is not None and len(seen) < 50:
        seen.append(type(node))
        node = getattr(node, "app", None) or getattr(node, "inner", None)
    assert [cls for cls in seen if cls in OURS] == list(OURS)
