"""scripts/cpu-flags.sh: llama.cpp's CMake flags from a /proc/cpuinfo flags line.

The oracle for an AVX2-only CPU is the string setup.sh hard-coded before it detected anything:
it must come out byte for byte, with the same cache key, so a wheel already built is reused.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "cpu-flags.sh"
LEGACY = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF"
)
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

# Real flag lines, trimmed to the interesting part (order as the kernel prints them).
AVX2_ONLY = (  # this build machine (an EPYC guest without AVX-512)
    "flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush "
    "mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl "
    "cpuid extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 x2apic movbe "
    "popcnt aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy abm sse4a misalignsse "
    "3dnowprefetch bmi1 avx2 smep bmi2 erms rdseed adx smap clflushopt sha_ni xsaveopt xsavec"
)
SAPPHIRE_RAPIDS = (
    "flags : fpu sse sse2 avx f16c fma avx2 bmi2 avx512f avx512dq avx512ifma avx512cd avx512bw "
    "avx512vl avx512_bf16 avx512vbmi avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq "
    "avx512_fp16 amx_bf16 amx_tile amx_int8"
)
SKYLAKE_X = "flags : sse avx f16c fma avx2 avx512f avx512dq avx512cd avx512bw avx512vl"
KNIGHTS_LANDING = "flags : avx avx2 fma f16c avx512f avx512pf avx512er avx512cd"  # no BW/VL/DQ
FP16_ONLY = "flags : avx2 fma f16c avx512fp16 avx512bw avx512vl avx512dq"  # no avx512f itself


def flags(line: str | None) -> str:
    call = 'llama_cpp_flags "$1"' if line is not None else "llama_cpp_flags"
    out = subprocess.run(
        ["bash", "-c", f'source "{SCRIPT}" && {call}', "_", line or ""],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stderr == ""
    return out.stdout.rstrip("\n")


def key(version: str, flag_string: str) -> str:
    out = subprocess.run(
        [
            "bash",
            "-c",
            f'source "{SCRIPT}" && llama_cpp_flags_key "$1" "$2"',
            "_",
            version,
            flag_string,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_avx2_only_cpu_gets_the_legacy_flags_and_key() -> None:
    assert flags(AVX2_ONLY) == LEGACY
    # setup.sh's old key: printf '%s %s' version flags | sha256sum | cut -c1-12
    old = hashlib.sha256(f"0.3.36 {LEGACY}".encode()).hexdigest()[:12]
    assert key("0.3.36", LEGACY) == old == "d267a80df23d"


@pytest.mark.parametrize("line", [KNIGHTS_LANDING, FP16_ONLY, "flags : avx2", "", "garbage"])
def test_incomplete_avx512_falls_back_to_avx2(line: str) -> None:
    assert flags(line) == LEGACY


def test_sapphire_rapids_gets_avx512_with_vnni_bf16_vbmi_and_no_amx() -> None:
    got = flags(SAPPHIRE_RAPIDS).split()
    assert got[:5] == LEGACY.split()[:5]
    assert "-DGGML_NATIVE=OFF" in got
    for on in ("AVX512", "AVX512_VNNI", "AVX512_BF16", "AVX512_VBMI"):
        assert f"-DGGML_{on}=ON" in got
    for off in ("AMX_TILE", "AMX_INT8", "AMX_BF16"):
        assert f"-DGGML_{off}=OFF" in got
    assert not any(f.endswith("=ON") and "AMX" in f for f in got)


def test_skylake_x_gets_avx512_without_the_extensions_it_lacks() -> None:
    got = flags(SKYLAKE_X).split()
    assert "-DGGML_AVX512=ON" in got
    for off in ("AVX512_VNNI", "AVX512_BF16", "AVX512_VBMI", "AMX_TILE", "AMX_INT8", "AMX_BF16"):
        assert f"-DGGML_{off}=OFF" in got
    assert key("0.3.36", " ".join(got)) != key("0.3.36", LEGACY)  # a separate wheel cache


def test_whole_flags_only() -> None:
    # "avx512f" must not be read out of "avx512fp16" nor "avx512_vnni" out of "avx512_vnni2"
    line = "flags : avx2 avx512fp16 avx512bw avx512vl avx512dq avx512_vnni2"
    assert flags(line) == LEGACY


def test_this_machine_reads_proc_cpuinfo() -> None:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo")
    first = next((ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags")), "")
    assert flags(None) == flags(first)
