"""The hardware catalogue: what each accelerator (or CPU node) type can do and what it costs.

Why a catalogue and not constants: the simulated roofline engine (rollart-proxy) and cost reports
need the numbers, users bring hardware we did not list, and each ResourceManager validates its pool
against its own catalogue (no global mutable registry).

Sources. H20 and H800: Table 2 of the RollArt paper (TFLOPS, HBM, HBM bandwidth, NVLink bandwidth,
normalised cost H20 = 1.00, H800 = 2.85; here re-normalised to H800 = 1.0, so H20 = 1/2.85).
H100 SXM, H200 SXM, A100 80GB SXM: NVIDIA datasheets (dense BF16 tensor TFLOPS, HBM, NVLink).
Their costs are ESTIMATES from public cloud list prices relative to H100 ~ H800 = 1.0.
``interconnect_gbps`` is the intra-node GPU interconnect in GB/s (Table 2's "NVLink bandwidth").
``network_gbps`` (per-device inter-node NIC, GB/s) and ``gpus_per_node`` feed the simulator's
collectives (design D14). NIC figures are ESTIMATES from NVIDIA's HGX reference designs: one 400 Gb/s
NDR InfiniBand NIC per GPU (50 GB/s) for H800/H100/H200/H20, 200 Gb/s HDR (25 GB/s) for A100.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from rollart import checks as check
from rollart.resource.errors import ResourceError, UnknownHardwareError

__all__ = ["BUILTIN_HARDWARE", "HardwareCatalogue", "HardwareSpec"]


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator (or CPU node) type: what the roofline model and cost reports need.

    Attributes:
        name: the type name used in pool specs and Ray custom resources (e.g. ``"H800"``).
        tflops_bf16: dense BF16 tensor throughput in TFLOPS.
        hbm_gb: device memory in GB (0 for a CPU node).
        hbm_tbps: device memory bandwidth in TB/s.
        interconnect_gbps: intra-node interconnect bandwidth in GB/s.
        cost: cost per device-hour, normalised so that H800 = 1.0.
        network_gbps: inter-node bandwidth per device in GB/s (its NIC; an ESTIMATE for the built-ins).
        gpus_per_node: devices that share the intra-node interconnect.
    """

    name: str
    tflops_bf16: float
    hbm_gb: float
    hbm_tbps: float
    interconnect_gbps: float
    cost: float
    network_gbps: float = 25.0
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        """Reject specs that would make a roofline estimate meaningless (NaN, negative, zero compute)."""
        # deps: none
        # VAL: VAL_TYPE(self.name, str, exc=ResourceError)
        check.of_type("name", self.name, str, exc=ResourceError)  # generated #0a2fb9cce2
        # VAL: VAL_NON_EMPTY(self.name, exc=ResourceError)
        check.non_empty("name", self.name, exc=ResourceError)  # generated #129505c07b
        # VAL: VAL_POSITIVE(self.tflops_bf16, exc=ResourceError)
        check.positive("tflops_bf16", self.tflops_bf16, exc=ResourceError)  # generated #774cfba275
        # VAL: VAL_NON_NEGATIVE(self.hbm_gb, exc=ResourceError)
        check.non_negative("hbm_gb", self.hbm_gb, exc=ResourceError)  # generated #824a69e2e9
        # VAL: VAL_NON_NEGATIVE(self.hbm_tbps, exc=ResourceError)
        check.non_negative("hbm_tbps", self.hbm_tbps, exc=ResourceError)  # generated #816bd68d0a
        # VAL: VAL_NON_NEGATIVE(self.interconnect_gbps, exc=ResourceError)
        check.non_negative("interconnect_gbps", self.interconnect_gbps, exc=ResourceError)  # generated #9f9dadd460
        # VAL: VAL_POSITIVE(self.cost, exc=ResourceError)
        check.positive("cost", self.cost, exc=ResourceError)  # generated #1df28c0a91
        # VAL: VAL_POSITIVE(self.network_gbps, exc=ResourceError)
        check.positive("network_gbps", self.network_gbps, exc=ResourceError)  # generated #f3917e361a
        # VAL: VAL_INT_RANGE(self.gpus_per_node, min=1, max=1024, exc=ResourceError)
        check.int_range("gpus_per_node", self.gpus_per_node, min=1, max=1024, exc=ResourceError)  # generated #91c74c2217

    def collective_gbps(self, devices: int) -> float:
        """Per-device bandwidth of a ring over `devices` of this type: NVLink inside a node, the NIC beyond."""
        # deps: none
        # VAL: VAL_INT_RANGE(devices, min=1, max=1 << 20, exc=ResourceError)
        check.int_range("devices", devices, min=1, max=1 << 20, exc=ResourceError)  # generated #800d752ce4
        if devices <= self.gpus_per_node:
            return self.interconnect_gbps
        return min(self.interconnect_gbps, self.network_gbps)


_H800_COST_IN_H20_UNITS = 2.85  # paper Table 2: H20 = 1.00, H800 = 2.85

BUILTIN_HARDWARE: Mapping[str, HardwareSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            # paper Table 2
            HardwareSpec("H800", tflops_bf16=989.5, hbm_gb=80, hbm_tbps=3.35, interconnect_gbps=400, cost=1.0,
                         network_gbps=50),
            HardwareSpec("H20", tflops_bf16=148, hbm_gb=96, hbm_tbps=4.0, interconnect_gbps=900,
                         cost=1.0 / _H800_COST_IN_H20_UNITS, network_gbps=50),
            # NVIDIA datasheets; costs are estimates relative to H800 = 1.0
            HardwareSpec("H100", tflops_bf16=989.5, hbm_gb=80, hbm_tbps=3.35, interconnect_gbps=900, cost=1.0,
                         network_gbps=50),
            HardwareSpec("H200", tflops_bf16=989.5, hbm_gb=141, hbm_tbps=4.8, interconnect_gbps=900, cost=1.3,
                         network_gbps=50),
            HardwareSpec("A100", tflops_bf16=312, hbm_gb=80, hbm_tbps=2.039, interconnect_gbps=600, cost=0.5,
                         network_gbps=25),
            # a CPU node slot for environments and sandboxes: little compute, no HBM, Ethernet (25 GB/s)
            HardwareSpec("CPU", tflops_bf16=1.0, hbm_gb=0, hbm_tbps=0, interconnect_gbps=25, cost=0.02,
                         network_gbps=25, gpus_per_node=1),
        )
    }
)


class HardwareCatalogue:
    """The hardware types one manager knows: the built-ins plus user-registered ones (no global registry)."""

    def __init__(self, extra: Iterable[HardwareSpec] = ()) -> None:
        """Start from BUILTIN_HARDWARE so every manager sees the same built-ins, then add the user's."""
        # deps: HardwareCatalogue.register
        self._specs: dict[str, HardwareSpec] = dict(BUILTIN_HARDWARE)
        for spec in extra:
            self.register(spec)

    def get(self, name: str) -> HardwareSpec:
        """Look a type up; an unknown name is an error that lists the known ones."""
        # deps: none
        # VAL: VAL_ONE_OF(name, choices=self._specs, exc=UnknownHardwareError)
        check.one_of("name", name, self._specs, exc=UnknownHardwareError)  # generated #62d704e053
        return self._specs[name]

    def register(self, spec: HardwareSpec) -> None:
        """Add a user-defined type; re-registering the same spec is a no-op, a different one an error."""
        # deps: none
        # VAL: VAL_TYPE(spec, HardwareSpec, exc=ResourceError)
        check.of_type("spec", spec, HardwareSpec, exc=ResourceError)  # generated #692ffd82b1
        # AST: AST_PRECONDITION(self._specs.get(spec.name, spec) == spec, got=spec.name, msg="a hardware name is registered with one spec only", exc=ResourceError)
        check.precondition(self._specs.get(spec.name, spec) == spec, "a hardware name is registered with one spec only", got=spec.name, exc=ResourceError)  # generated #efa3e709ba
        self._specs[spec.name] = spec

    def cost_per_hour(self, devices: Mapping[str, int]) -> float:
        """Relative cost of holding `devices` (hardware name -> count) for an hour, in H800-hours (D34)."""
        # deps: HardwareCatalogue.get
        total = 0.0
        for name, count in devices.items():
            # VAL: VAL_INT_RANGE(count, min=0, max=1 << 20, exc=ResourceError)
            check.int_range("count", count, min=0, max=1 << 20, exc=ResourceError)  # generated #238fbc01ff
            total += self.get(name).cost * count
        return total

    def names(self) -> tuple[str, ...]:
        """The known type names, sorted, for messages and CLIs."""
        # deps: none
        return tuple(sorted(self._specs))

    def __contains__(self, name: object) -> bool:
        """Membership test used by pool validation."""
        # deps: none
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        """Iterate over the known names (sorted), so error messages can list them."""
        return iter(self.names())
