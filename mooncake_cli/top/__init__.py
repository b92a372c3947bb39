"""`mooncake top`: a cluster seen from its conductor, gathered apart from how it is drawn.

    scrape = gather(Sources("http://127.0.0.1:8000"))    # scrape.py: what the cluster serves
    snap = build(scrape, previous=None)                   # snapshot.py: the figures, JSON-able
    console.print(render(snap))                           # view.py: rich tables

Only public endpoints and the API-key-guarded instance list are read: the conductor's
`/v1/instances` and `/metrics`, each instance's `/metrics`, and (when given) store masters'
`/metrics`. No cluster secret is needed.
"""

from mooncake_cli.top.scrape import Scrape, Sources, gather
from mooncake_cli.top.snapshot import ClusterSnapshot, build

__all__ = ["ClusterSnapshot", "Scrape", "Sources", "build", "gather"]
