"""Step 5: the programming model on the local runtime (the same code runs on Ray: test_ray.py)."""

from __future__ import annotations

import pytest

from rollart.resource.cluster import Cluster
from rollart.resource.decorators import hw_mapping, register, register_serverless
from rollart.resource.errors import ResourceError, UnknownHardwareError
from rollart.resource.manager import ResourceManager
from rollart.resource.worker import Worker

POOL = {"H800": range(0, 2), "H20": range(2, 8)}


class Trainer(Worker):
    def __init__(self, context, scale=1):
        super().__init__(context)
        self.scale = scale

    @register(mode="execute_all")
    def compute_gradients(self, batch):
        return {"rank": self.rank, "sum": sum(batch) * self.scale, "devices": self.devices}

    @register(mode="execute_rank0")
    async def save(self, path):
        return f"{path}@{self.rank}"

    @register(mode="dp_split")
    def square(self, items, offset=0):
        return [x * x + offset for x in items]

    def undecorated(self):
        return "not bound"


class Gen(Worker):
    @hw_mapping(hw_affinity={"FrozenLake": "H800", "default": "H20"})
    def generate(self, input_ids, tag_name="default"):
        return (self.hw, self.rank, tag_name, list(input_ids))

    @hw_mapping(hw_affinity={"math": "H20", "default": "H800"})
    def no_tag(self, x):
        return self.hw


@pytest.fixture
def rm():
    manager = ResourceManager(POOL)
    yield manager
    manager.close()


async def test_execute_all_rank0_dp_split(rm):
    trainers = await Cluster.create(rm, Trainer, role="train", hw="H800", num_workers=2, kwargs={"scale": 10})
    assert trainers.name == "Trainer-train" and trainers.ranks == (0, 1)
    grads = await trainers.compute_gradients([1, 2, 3])
    assert grads == [{"rank": 0, "sum": 60, "devices": (0,)}, {"rank": 1, "sum": 60, "devices": (1,)}]
    assert await trainers.save("ckpt") == "ckpt@0"
    assert await trainers.square(list(range(7)), offset=1) == [x * x + 1 for x in range(7)]
    assert await trainers.square([3]) == [9]  # fewer items than workers
    assert await trainers.square([]) == []
    assert not hasattr(trainers, "undecorated")
    with pytest.raises(ResourceError, match="items must be of type"):
        await trainers.square("abc")
    # the ledger and the store know the workers
    assert {d: (r.role, r.owner) for d, r in rm.devices().items() if r.owner} == {
        0: ("train", "Trainer-train"), 1: ("train", "Trainer-train")}
    assert [(w.id, w.health, w.devices) for w in rm.store.workers("Trainer-train")] == [
        ("Trainer-train/0", "alive", (0,)), ("Trainer-train/1", "alive", (1,))]
    await trainers.shutdown()
    assert all(r.role == "free" for r in rm.devices().values())
    assert {w.health for w in rm.store.workers()} == {"removed"}


async def test_hw_mapping_routes_by_tag(rm):
    gens = await Cluster.create(rm, Gen, role="rollout", hw={"H800": 2, "H20": 3}, num_workers=5, name="gens")
    assert [gens.hw_of(r) for r in gens.ranks] == ["H800", "H800", "H20", "H20", "H20"]
    frozen = [await gens.generate([1, 2], tag_name="FrozenLake") for _ in range(4)]
    assert {f[0] for f in frozen} == {"H800"} and [f[1] for f in frozen] == [0, 1, 0, 1]  # round robin
    assert frozen[0][2:] == ("FrozenLake", [1, 2])
    other = [await gens.generate([3], tag_name="GEM-math") for _ in range(3)]
    assert {o[0] for o in other} == {"H20"} and sorted(o[1] for o in other) == [2, 3, 4]
    assert (await gens.generate([4]))[0] == "H20"
    assert await gens.no_tag(1, tag_name="math") == "H20"  # tag_name consumed, not passed on
    await gens.shutdown()
    # fallback: no H800 worker in this cluster -> the default's type
    only_h20 = await Cluster.create(rm, Gen, role="rollout", hw="H20", num_workers=2, name="only-h20")
    assert (await only_h20.generate([1], tag_name="FrozenLake"))[0] == "H20"
    await only_h20.shutdown()


async def test_create_is_all_or_nothing(rm):
    snapshot_devices = rm.devices()

    class Exploding(Worker):
        def __init__(self, context):
            super().__init__(context)
            if context.rank == 2:
                raise RuntimeError("cannot load model")

    with pytest.raises(RuntimeError, match="cannot load model"):
        await Cluster.create(rm, Exploding, role="rollout", hw="H20", num_workers=3)
    assert rm.devices() == snapshot_devices
    with pytest.raises(ResourceError, match="cannot allocate 1 free devices of hw='H800'"):
        await Cluster.create(rm, Trainer, role="train", hw="H800", num_workers=3)
    assert rm.devices() == snapshot_devices
    with pytest.raises(ResourceError, match="hw counts must sum to num_workers=3"):
        await Cluster.create(rm, Trainer, role="train", hw={"H800": 1}, num_workers=3)
    with pytest.raises(ResourceError, match="num_workers must be an integer in"):
        await Cluster.create(rm, Trainer, role="train", num_workers=0)
    with pytest.raises(ResourceError, match="worker_cls is a Worker subclass"):
        await Cluster.create(rm, dict, role="train", num_workers=1)  # type: ignore[arg-type]

    class BadAffinity(Worker):
        @hw_mapping(hw_affinity={"default": "TPUv9"})
        def f(self):
            return 1

    with pytest.raises(UnknownHardwareError, match=r"hw_affinity\['default'\] must be one of"):
        await Cluster.create(rm, BadAffinity, role="rollout", num_workers=1)
    first = await Cluster.create(rm, Trainer, role="train", num_workers=1, name="t")
    with pytest.raises(ResourceError, match="'t' already owns devices"):
        await Cluster.create(rm, Trainer, role="train", num_workers=1, name="t")
    await first.shutdown()
    assert rm.devices() == snapshot_devices


def test_decorator_validation():
    with pytest.raises(ResourceError, match="mode must be one of"):
        register(mode="broadcast")
    with pytest.raises(ResourceError, match="hw_affinity has a 'default' entry"):
        hw_mapping(hw_affinity={"FrozenLake": "H800"})
    with pytest.raises(ResourceError, match="url is http"):
        register_serverless(attribute="reward_proxy", url="fc://xxx")
    with pytest.raises(ResourceError, match="retries must be an integer in"):
        register_serverless(attribute="reward_proxy", url="http://127.0.0.1:1", retries=-1)
