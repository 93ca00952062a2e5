"""Compile every kernel to PTX (no GPU needed) and summarise what the compiler made of it.

``python -m q2gemv.cuda.ptx [--cc 9.0] [--family NAME ...] [--dump DIR]`` prints
a JSON summary per kernel (of the families named, default all of
:data:`FAMILIES`): whether it uses local memory (spills or a register array that did
not stay in registers), and instruction counts that matter for the inner
loop. Must run with the real numba CUDA target (not the simulator); NVVM
comes from pip (``numba-cuda[cu13]``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path

from ..dispatch import registry
from ..tools import atomic as _atomic

COMPILER_HINT = (
    "PTX needs numba's real CUDA target with NVVM and NVRTC: pip install 'q2gemv[cu13]' "
    "(or numba-cuda[cu13]; no GPU needed) and leave NUMBA_ENABLE_CUDASIM unset"
)
# compile unit -> module with ptx_specs(): each family's seed kernels ("q2_0") and exact
# kernels ("q2_0_exact"), the modules its registry.FamilySpec names, and any module a kernel's
# spec names (a new family or kernel module is listed here by registering it).
MODULES = {
    name: module
    for f in registry.families()
    for name, module in ((f.name, f.seed_module), (f"{f.name}_exact", f.exact_module))
}
# a family's other device code (FamilySpec.device_modules), and a kernel in a module of its own
# (KernelSpec.module): a compile unit each, named by the module
for f in registry.families():
    for _m in f.device_modules:
        MODULES[_m.removeprefix("q2gemv.cuda.").replace(".", "_")] = _m
for _m in dict.fromkeys(registry.module_of(s.name) for s in registry.specs()):
    if _m not in MODULES.values():
        MODULES[_m.removeprefix("q2gemv.cuda.").replace(".", "_")] = _m
FAMILIES = tuple(MODULES)


def kernel_specs(families=FAMILIES) -> list[tuple[str, object, str]]:
    """``(name, body, signature)`` of every kernel of ``families`` (default: the whole package).

    The families compile independently (``q2_0_exact`` alone takes about a
    minute on one core), so callers may run them in separate processes.
    """
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"families: unknown {unknown}, expected some of {list(FAMILIES)}")
    specs = []
    for fam in families:
        specs += list(importlib.import_module(MODULES[fam]).ptx_specs())
    return specs


def summarise(ptx: str) -> dict:
    body = [ln.strip() for ln in ptx.splitlines() if ln.strip() and not ln.strip().startswith("//")]
    ops = [ln.split()[0] for ln in body if re.match(r"^[a-z]", ln)]

    def count(prefix: str) -> int:
        return sum(1 for o in ops if o.startswith(prefix))

    return {
        "uses_local_memory": bool(re.search(r"\.local\b|ld\.local|st\.local", ptx)),
        "instructions": len(ops),
        "fma.rn.f32": count("fma.rn.f32"),
        "mul.rn.f32": count("mul.rn.f32"),
        "add.rn.f32": count("add.rn.f32"),
        "shfl": count("shfl"),
        "mma.sync.aligned.m16n8k32": count("mma.sync.aligned.m16n8k32"),
        "mma.m16n8k16.s8.u8": count("mma.sync.aligned.m16n8k16.row.col.s32.s8.u8"),
        "ld.global": count("ld.global"),
        "ld.global.nc.L1::no_allocate": count("ld.global.nc.L1::no_allocate"),
        "ld.shared": count("ld.shared"),
        "griddepcontrol.wait": count("griddepcontrol.wait"),
        "griddepcontrol.launch_dependents": count("griddepcontrol.launch_dependents"),
    }


def compile_all(cc: tuple[int, int] = (9, 0), families=FAMILIES) -> dict[str, str]:
    from numba import config, cuda

    if config.ENABLE_CUDASIM:
        raise RuntimeError("PTX needs the real CUDA target: unset NUMBA_ENABLE_CUDASIM")
    specs = kernel_specs(families)
    return {name: cuda.compile_ptx(body, sig, cc=cc)[0] for name, body, sig in specs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cc", default="9.0")
    p.add_argument(
        "--family",
        action="append",
        choices=FAMILIES,
        help="compile only this family (repeatable; default: all)",
    )
    p.add_argument("--dump", type=Path, help="write NAME.ptx files here")
    args = p.parse_args(argv)
    cc = tuple(int(x) for x in args.cc.split("."))
    from numba import config

    if config.ENABLE_CUDASIM:
        print(f"q2gemv.cuda.ptx: the CUDA simulator is on; {COMPILER_HINT}", file=sys.stderr)
        return 1
    from numba.cuda.cudadrv.error import NvrtcSupportError, NvvmSupportError

    try:
        ptxs = compile_all(cc, tuple(args.family or FAMILIES))  # type: ignore[arg-type]
    except (NvvmSupportError, NvrtcSupportError) as e:  # a 30-line trace without this
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"q2gemv.cuda.ptx: {first}; {COMPILER_HINT}", file=sys.stderr)
        return 1
    if args.dump:
        args.dump.mkdir(parents=True, exist_ok=True)
        for name, ptx in ptxs.items():
            _atomic.write_text(args.dump / f"{name}.ptx", ptx)
    json.dump({name: summarise(ptx) for name, ptx in ptxs.items()}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
