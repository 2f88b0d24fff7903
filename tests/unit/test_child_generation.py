"""The generation a child runs (isolation.Generations): a new one for every registry,
even one placed where a freed registry lived (its ``id`` used to be the generation, and
CPython hands a freed object's address to the next one of its size)."""

from __future__ import annotations

from runner.worker.isolation import Generations


class Snapshot:
    """Stands in for a registry: any object the executors hold for a while, then drop."""


def test_every_registry_gets_a_generation_of_its_own_whatever_its_address() -> None:
    gens = Generations()
    seen: list[int] = []
    addresses: set[int] = set()
    reused = 0
    for _ in range(300):
        reg = Snapshot()
        reused += id(reg) in addresses
        addresses.add(id(reg))
        first = gens.of(reg)
        assert gens.of(reg) == first  # the same registry, the same generation
        seen.append(first)
        del reg
    assert reused > 0  # addresses did come back: ids would have said "same code"
    assert seen == sorted(set(seen)), "a reload kept an earlier generation"
