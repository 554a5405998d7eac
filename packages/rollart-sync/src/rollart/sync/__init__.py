"""rollart.sync: Versioned weight synchronization: bucketing, a local channel, torch.distributed broadcast, and a Mooncake cross-cluster channel."""

__version__ = "0.1.0"
