"""The console's numbers (selectors: reads only), as JSON-ready values: the overview, the
tenant page and the node pages, one module each.

Each selector costs a fixed number of queries whatever the number of tenants, nodes or
requests: aggregates are grouped in the database, never computed per tenant in a loop.
What the platform app already selects (nodes, deployments) comes from
``shunter.platform.selectors``.
"""

from shunter.console.selectors.nodes import (
    NodeView,
    node_list_without_state,
    node_view,
    node_views,
)
from shunter.console.selectors.overview import (
    WINDOWS_MIN,
    Overview,
    TenantRow,
    attainment_status,
    overview,
    overview_figures,
)
from shunter.console.selectors.tenants import (
    tenant_detail,
    tenant_keys,
    tenant_latency_samples,
    tenant_quota_usage,
    tenant_recent_requests,
)

__all__ = [
    "WINDOWS_MIN",
    "NodeView",
    "Overview",
    "TenantRow",
    "attainment_status",
    "node_list_without_state",
    "node_view",
    "node_views",
    "overview",
    "overview_figures",
    "tenant_detail",
    "tenant_keys",
    "tenant_latency_samples",
    "tenant_quota_usage",
    "tenant_recent_requests",
]
