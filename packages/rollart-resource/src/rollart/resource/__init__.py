"""rollart.resource: Hardware pools, the resource manager and its metadata store, the Cluster/Worker programming model on Ray, the device-role ledger."""

__version__ = "0.1.0"
