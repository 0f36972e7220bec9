#!/usr/bin/env python3
"""Static checks of the compiled device code; needs no GPU.

  check_kernels.py <libfp8proj.a>

1. Every kernel has a zero stack frame and no local memory (spills land in local memory):
   read from `cuobjdump --dump-resource-usage`.
2. The sm90 FP8 GEMM kernels' SASS contains QGMMA (the FP8 WGMMA); a matrix kernel that
   shows only HMMA/FFMA is on a slower path.
3. The QGMMAs are not serialized: when ptxas cannot prove that no accumulator of a wgmma in
   flight is read (its warning C7514), it makes every QGMMA wait for the one before
   (`WARPGROUP.DEPBAR.LE gsb0, 0x0` after each). Each kernel must chain at least one QGMMA
   without a scoreboard wait, and the kernels whose main loop keeps two K blocks in flight
   (1d2d with one consumer warpgroup, m64 x up to 128 columns) must wait with
   `DEPBAR.LE gsb0, 0x1`.
4. The carrying kernels (`_c`, kCarry) keep the next tile's first K block in flight through
   the epilogue: between the last QGMMA before the epilogue's first STSM and that STSM there
   is no `WARPGROUP.DEPBAR` (ptxas may add one wait on the exit path, C7517; one before the
   stores would silently turn the overlap off).
5. Every GEMM kernel can load its weight with an L2 cache policy (evict-first, ptx/tma.cuh): in
   SASS a TMA load that carries one shows a `desc[...]` operand (`UTMALDG.2D [..], [..],
   desc[..]`). Without it the weight stream evicts the L2's dirty lines and pays their
   write-backs (7-16% at small M on an H200). (The 1d2d kernels also have a load without
   it, taken when the host's weight_evict_first() says the weight stays in the L2.)
6. Every GEMM kernel is built twice, with and without the hang watchdog (the kernel template's
   kWatchdog; FP8PROJ_WATCHDOG_MS picks), and only the watchdog builds contain its code (a
   %globaltimer read): the default kernels must stay the code they were before it (the watchdog
   builds measured 2.6% slower, docs/robustness.md).
7. Programmatic dependent launch (FP8PROJ_PDL, src/cuda/common/pdl.cuh): every kernel the
   decode path launches through cuda/common/launch.hpp -- the sm90 GEMMs, the activation
   quantizers, the MLA decode kernels -- contains griddepcontrol.wait (SASS `ACQBULK`) and
   griddepcontrol.launch_dependents (`PREEXIT`), and no global load, store, atomic or TMA copy
   comes before the first ACQBULK in program order (the rule: nothing global before the wait;
   the tensor-map prefetch, `UTMACCTL`, and parameter loads, `LDC`, may).

cuobjdump comes with the CUDA toolkit or from PyPI (nvidia-cuda-cuobjdump +
nvidia-cuda-nvdisasm, installed by scripts/setup-deps.sh). Without it the test exits 77,
which CTest reports as skipped.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig


def find_tool(name):
    path = shutil.which(name)
    if path:
        return path
    for base in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        hits = sorted(glob.glob(os.path.join(base, "nvidia", "*", "bin", name)))
        if hits:
            return hits[-1]
    cuda = os.path.join("/usr/local/cuda/bin", name)
    return cuda if os.path.exists(cuda) else None


def pipelined(mangled):
    """Whether the kernel's template arguments select the two-partial main loop (kPipelined)."""
    m = re.search(r"Gemm1d2dTraitsILi(\d+)ELi(\d+)ELi(\d+)E", mangled)
    if not m:
        return False
    block_m, block_n, wgs = map(int, m.groups())
    return wgs == 1 and block_m == 64 and block_n <= 128


def carries(mangled):
    """Whether the 1d2d kernel's last template argument, kCarry, is true."""
    return re.search(r"Gemm1d2dTraitsI(?:L[ib]\d+E)*Lb1EEE", mangled) is not None


def carried_through_epilogue(block):
    """True when no wgmma wait separates the last QGMMA before the first STSM from it."""
    lines = block.split("\n")
    first_stsm = next((i for i, line in enumerate(lines) if "STSM" in line), None)
    if first_stsm is None:
        return False
    last_q = max((i for i in range(first_stsm) if "QGMMA" in lines[i]), default=None)
    if last_q is None:
        return False
    return not any("WARPGROUP.DEPBAR" in line for line in lines[last_q:first_stsm])


# Kernels launched with programmatic dependent launch when FP8PROJ_PDL=1 (check 7).
PDL_KERNELS = ("sm90_fp8_gemm", "activation_quant_kernel", "rmsnorm_kernel", "decode_rope_kernel",
               "head_gemm_kernel", "decode_attention_sm90_kernel", "decode_combine_kernel")
# Global-memory instructions (opcode before the first dot): none may precede the PDL wait.
GLOBAL_OPS = {"LDG", "STG", "LD", "ST", "ATOM", "ATOMG", "RED", "REDG", "LDGSTS", "UTMALDG", "UTMASTG",
              "UBLKCP", "UTMAREDG", "UBLKRED", "LDGDEPBAR"}


def opcodes(block):
    """The block's instructions' opcodes (without modifiers or predicate), in program order."""
    out = []
    for line in block.split("\n"):
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            out.append(m.group(1))
    return out


def pdl_problem(block):
    """Why the block breaks check 7, or None."""
    ops = opcodes(block)
    if "ACQBULK" not in ops:
        return "no griddepcontrol.wait (ACQBULK)"
    if "PREEXIT" not in ops:
        return "no griddepcontrol.launch_dependents (PREEXIT)"
    early = [op for op in ops[: ops.index("ACQBULK")] if op in GLOBAL_OPS]
    if early:
        return "global memory accessed before griddepcontrol.wait: " + ", ".join(sorted(set(early)))
    return None


def main():
    lib = sys.argv[1]
    cuobjdump = find_tool("cuobjdump")
    if cuobjdump is None:
        print("SKIP: cuobjdump not found (install nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm)")
        return 77
    env = dict(os.environ)
    nvdisasm = find_tool("nvdisasm")
    if nvdisasm:  # cuobjdump -sass calls nvdisasm from PATH
        env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")

    usage = subprocess.run([cuobjdump, "--dump-resource-usage", lib], capture_output=True, text=True, check=True,
                           env=env).stdout
    funcs = re.findall(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
    if not funcs:
        print("FAIL: no device functions found in", lib)
        return 1
    bad = [(f, s, l) for f, r, s, l in funcs if int(s) or int(l)]
    for f, r, s, l in funcs:
        print(f"REG {int(r):3d} STACK {s} LOCAL {l}  {f[:110]}")
    if bad:
        for f, s, l in bad:
            print(f"FAIL: {f} has STACK {s} / LOCAL {l} bytes (spills or a run-time-indexed array)")
        return 1

    sass = subprocess.run([cuobjdump, "-sass", lib], capture_output=True, text=True, check=True, env=env).stdout
    blocks = re.split(r"\n\s*Function : ", sass)
    gemm = [b for b in blocks if "sm90_fp8_gemm" in b.split("\n", 1)[0]]
    if not gemm:
        print("FAIL: no sm90_fp8_gemm kernels in", lib)
        return 1
    missing = [b.split("\n", 1)[0] for b in gemm if "QGMMA" not in b]
    for b in gemm:
        print(f"QGMMA x{b.count('QGMMA'):3d}  {b.split(chr(10), 1)[0][:110]}")
    if missing:
        for name in missing:
            print("FAIL: no QGMMA in", name)
        return 1
    serialized = []
    for b in gemm:
        name = b.split("\n", 1)[0]
        qgmma = [line for line in b.split("\n") if "QGMMA" in line]
        if all("gsb0" in line for line in qgmma):
            serialized.append(name + " (every QGMMA waits for the one before)")
        if pipelined(name) and "DEPBAR.LE gsb0, 0x1" not in b:
            serialized.append(name + " (main loop does not keep two K blocks in flight)")
        if carries(name) and not carried_through_epilogue(b):
            serialized.append(name + " (_c: a wgmma wait before the epilogue's stores ends the carried K block's overlap)")
    if serialized:
        for name in serialized:
            print("FAIL: serialized wgmma in", name)
        return 1
    no_policy = [b.split("\n", 1)[0] for b in gemm
                 if not any("UTMALDG" in line and "desc[" in line for line in b.split("\n"))]
    if no_policy:
        for name in no_policy:
            print("FAIL: no TMA load with an L2 cache policy (the evict-first weight load) in", name)
        return 1
    watched = {}
    for b in gemm:
        name = b.split("\n", 1)[0]
        m = re.search(r"Lb([01])EEEv14CUtensorMap", name)
        if not m:
            print("FAIL: no kWatchdog template argument in", name)
            return 1
        on = m.group(1) == "1"
        if on != ("GLOBALTIMER" in b):
            print(f"FAIL: {name}: kWatchdog={int(on)} but {'no' if on else 'a'} %globaltimer read in its SASS")
            return 1
        key = name[: m.start()]
        watched.setdefault(key, set()).add(on)
    single = [k for k, v in watched.items() if v != {False, True}]
    if single:
        for k in single:
            print("FAIL: not built both with and without the watchdog:", k)
        return 1
    pdl = [b for b in blocks if any(k in b.split("\n", 1)[0] for k in PDL_KERNELS)]
    missing_pdl = [k for k in PDL_KERNELS if not any(k in b.split("\n", 1)[0] for b in pdl)]
    if missing_pdl:
        print("FAIL: kernels of the PDL launch path not found in the library:", ", ".join(missing_pdl))
        return 1
    bad_pdl = [(b.split("\n", 1)[0], pdl_problem(b)) for b in pdl if pdl_problem(b)]
    if bad_pdl:
        for name, why in bad_pdl:
            print(f"FAIL: {name}: {why}")
        return 1
    n_carry = sum(carries(b.split("\n", 1)[0]) for b in gemm)
    print(f"OK: {len(funcs)} kernels with zero stack/local memory; {len(gemm)} FP8 GEMM kernels use QGMMA; "
          f"{n_carry} carry a K block through their epilogue; all load the weight with an L2 policy; "
          f"{len(watched)} built with and without the watchdog; {len(pdl)} kernels wait (ACQBULK) before "
          f"their first global access and release their dependents (PREEXIT)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
