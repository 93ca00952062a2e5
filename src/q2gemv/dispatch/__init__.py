"""Dispatch policy, pure and numba-free: which kernel, which launches, which tier.

* :mod:`.registry`: one ``KernelSpec`` per kernel, one ``FamilySpec`` per weight family.
* :mod:`.plan`: launch geometry (grids, ``ChunkPlan``, per-launch checks).
* :mod:`.seed_rules`: the seed contract's measured default kernel per family.
* :mod:`.nvfp4_tiers`: the NVFP4 W4A16 tier table, ``select_tier``, the kill switches.

Importing it loads no numba, reads no file and queries no device.
"""
