"""``system_info`` and its parsers on fixed /proc and /sys texts: an AVX2-only Zen 3, a
Sapphire Rapids with AMX on two sockets, a cgroup v2 container with ``cpu.max`` "150000 100000",
and a cgroup v1 host. Nothing here reads or assumes this machine's instruction set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frameserve.cgroup import (
    parse_cfs_quota,
    parse_cpu_max,
    parse_memory_limit,
    parse_mountinfo,
    parse_proc_cgroup,
    read_cgroup_limits,
)
from frameserve.tuning import ISA_FLAGS, SystemInfo, system_info
from frameserve.tuning._sysinfo import NumaNode, parse_cache_size, parse_cpuinfo, parse_cpulist, parse_meminfo_total

pytestmark = pytest.mark.unit

ZEN3_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
    "syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid "
    "extd_apicid aperfmperf pni pclmulqdq monitor ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes "
    "xsave avx f16c rdrand lahf_lm cmp_legacy svm extapic cr8_legacy abm sse4a misalignsse 3dnowprefetch "
    "osvw ibs skinit wdt tce topoext perfctr_core perfctr_nb bpext perfctr_llc mwaitx cpb cat_l3 cdp_l3 "
    "invpcid_single hw_pstate ssbd mba ibrs ibpb stibp vmmcall fsgsbase bmi1 avx2 smep bmi2 erms invpcid "
    "cqm rdt_a rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves cqm_llc cqm_occup_llc "
    "cqm_mbm_total cqm_mbm_local clzero irperf xsaveerptr rdpru wbnoinvd amd_ppin arat npt lbrv svm_lock "
    "nrip_save tsc_scale vmcb_clean flushbyasid decodeassists pausefilter pfthreshold v_vmsave_vmload vgif "
    "v_spec_ctrl umip pku ospke vaes vpclmulqdq rdpid overflow_recov succor smca fsrm"
)
SPR_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi mmx fxsr sse "
    "sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc art arch_perfmon pebs bts rep_good nopl "
    "xtopology nonstop_tsc cpuid aperfmperf tsc_known_freq pni pclmulqdq dtes64 monitor ds_cpl vmx smx est "
    "tm2 ssse3 sdbg fma cx16 xtpr pdcm pcid dca sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes "
    "xsave avx f16c rdrand lahf_lm abm 3dnowprefetch cpuid_fault epb cat_l3 cat_l2 cdp_l3 invpcid_single "
    "intel_ppin cdp_l2 ssbd mba ibrs ibpb stibp ibrs_enhanced tpr_shadow flexpriority ept vpid ept_ad "
    "fsgsbase tsc_adjust bmi1 hle avx2 smep bmi2 erms invpcid rtm cqm rdt_a avx512f avx512dq rdseed adx smap "
    "avx512ifma clflushopt clwb intel_pt avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves "
    "cqm_llc cqm_occup_llc cqm_mbm_total cqm_mbm_local split_lock_detect avx_vnni avx512_bf16 wbnoinvd dtherm "
    "ida arat pln pts hfi vnmi avx512vbmi umip pku ospke waitpkg avx512_vbmi2 gfni vaes vpclmulqdq "
    "avx512_vnni avx512_bitalg tme avx512_vpopcntdq la57 rdpid bus_lock_detect cldemote movdiri movdir64b "
    "enqcmd fsrm md_clear serialize tsxldtrk pconfig arch_lbr ibt amx_bf16 avx512_fp16 amx_tile amx_int8 "
    "flush_l1d arch_capabilities"
)


def cpuinfo(model: str, vendor: str, flags: str, *, sockets: int, cores: int, smt: int) -> str:
    """A /proc/cpuinfo with ``sockets`` × ``cores`` × ``smt`` processors (Linux numbers the SMT
    siblings after all first threads, as it does on these machines)."""
    blocks = []
    n = 0
    for thread in range(smt):
        for socket in range(sockets):
            for core in range(cores):
                blocks.append(
                    f"processor\t: {n}\nvendor_id\t: {vendor}\ncpu family\t: 6\nmodel name\t: {model}\n"
                    f"physical id\t: {socket}\nsiblings\t: {cores * smt}\ncore id\t\t: {core}\n"
                    f"cpu cores\t: {cores}\napicid\t\t: {socket * 64 + core * 2 + thread}\nflags\t\t: {flags}\n"
                )
                n += 1
    return "\n".join(blocks) + "\n"


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def machine(
    root: Path,
    cpuinfo_text: str,
    *,
    nodes: dict[int, str],
    caches: list[tuple[int, str, str, str]],
    mem_kib: int = 65_536_000,
) -> Path:
    write(root, "proc/cpuinfo", cpuinfo_text)
    write(root, "proc/meminfo", f"MemTotal:       {mem_kib} kB\nMemFree:        1000 kB\n")
    for node, cpus in nodes.items():
        write(root, f"sys/devices/system/node/node{node}/cpulist", cpus + "\n")
    write(root, "sys/devices/system/node/online", "0\n")  # not a node folder: ignored
    for i, (level, kind, size, shared) in enumerate(caches):
        base = f"sys/devices/system/cpu/cpu0/cache/index{i}"
        write(root, f"{base}/level", f"{level}\n")
        write(root, f"{base}/type", f"{kind}\n")
        write(root, f"{base}/size", f"{size}\n")
        write(root, f"{base}/shared_cpu_list", f"{shared}\n")
    return root


def zen3(root: Path) -> Path:
    """AMD EPYC 7763 (Zen 3), 1 socket, 8 cores, SMT 2: AVX2 + FMA, no AVX-512, no VNNI, no BF16."""
    text = cpuinfo("AMD EPYC 7763 64-Core Processor", "AuthenticAMD", ZEN3_FLAGS, sockets=1, cores=8, smt=2)
    return machine(
        root,
        text,
        nodes={0: "0-15"},
        caches=[
            (1, "Data", "32K", "0,8"),
            (1, "Instruction", "32K", "0,8"),
            (2, "Unified", "512K", "0,8"),
            (3, "Unified", "32768K", "0-15"),
        ],
    )


def sapphire_rapids(root: Path) -> Path:
    """Xeon Platinum 8480+ (Sapphire Rapids), 2 sockets × 4 cores here, SMT 2, 2 NUMA nodes, AMX."""
    text = cpuinfo("Intel(R) Xeon(R) Platinum 8480+", "GenuineIntel", SPR_FLAGS, sockets=2, cores=4, smt=2)
    return machine(
        root,
        text,
        nodes={0: "0-3,8-11", 2: "4-7,12-15"},  # node numbers may have gaps
        caches=[
            (1, "Data", "48K", "0,8"),
            (1, "Instruction", "32K", "0,8"),
            (2, "Unified", "2048K", "0,8"),
            (3, "Unified", "107520K", "0-3,8-11"),
        ],
    )


def cgroup_v2(root: Path, *, cpu_max: str, memory_max: str, path: str = "/") -> None:
    """A container with a cgroup namespace: cgroup2 on /sys/fs/cgroup, the process at ``path``."""
    write(root, "proc/self/cgroup", f"0::{path}\n")
    write(
        root,
        "proc/self/mountinfo",
        "22 1 0:21 / / rw,relatime - overlay overlay rw,lowerdir=/l\n"
        "30 22 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n",
    )
    folder = "sys/fs/cgroup" + ("" if path == "/" else path)
    write(root, f"{folder}/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n")
    write(root, f"{folder}/cpu.max", cpu_max + "\n")
    write(root, f"{folder}/memory.max", memory_max + "\n")


# -- the parsers -------------------------------------------------------------------------------


def test_cpuinfo_counts_sockets_cores_and_smt_threads(tmp_path: Path) -> None:
    cpu = parse_cpuinfo(cpuinfo("X", "GenuineIntel", "fma avx2", sockets=2, cores=4, smt=2))
    assert (cpu.logical_cpus, cpu.physical_cores, cpu.sockets) == (16, 8, 2)
    assert cpu.model == "X" and cpu.vendor == "GenuineIntel" and {"fma", "avx2"} <= cpu.flags


def test_cpuinfo_without_topology_counts_each_processor_as_a_core() -> None:
    text = "processor\t: 0\nFeatures\t: fp asimd asimddp bf16 i8mm\n\nprocessor\t: 1\nFeatures\t: fp asimd asimddp bf16 i8mm\n"
    cpu = parse_cpuinfo(text)  # Arm: no model name, no physical id
    assert (cpu.model, cpu.logical_cpus, cpu.physical_cores, cpu.sockets) == ("unknown", 2, 2, 1)
    assert {"asimddp", "bf16", "i8mm"} <= cpu.flags


@pytest.mark.parametrize(
    ("text", "cpus"), [("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}), ("5\n", {5}), ("", set()), ("0-1, 4", {0, 1, 4})]
)
def test_cpulist(text: str, cpus: set[int]) -> None:
    assert parse_cpulist(text) == cpus


def test_sizes_quotas_and_limits() -> None:
    assert parse_cache_size("48K\n") == 48 * 1024
    assert parse_cache_size("32768K") == 32 << 20
    assert parse_cache_size("2M") == 2 << 20
    with pytest.raises(ValueError):
        parse_cache_size("lots")
    assert parse_cpu_max("150000 100000\n") == 1.5
    assert parse_cpu_max("max 100000") is None
    assert parse_cfs_quota("-1\n", "100000\n") is None
    assert parse_cfs_quota("250000", "100000") == 2.5
    assert parse_memory_limit("max\n") is None
    assert parse_memory_limit("9223372036854771712\n") is None  # cgroup v1: no limit
    assert parse_memory_limit("2147483648") == 2 << 30
    assert parse_meminfo_total("MemTotal:       24683652 kB\nMemFree: 1 kB\n") == 24683652 * 1024


def test_proc_cgroup_and_mountinfo() -> None:
    groups = parse_proc_cgroup("12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/x\n0::/user.slice\n")
    assert groups["cpu"] == groups["cpuacct"] == groups["memory"] == "/docker/abc" and groups[""] == "/user.slice"
    mounts = parse_mountinfo(
        "35 31 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:5 - cgroup cgroup rw,cpu,cpuacct\n"
        "41 31 0:38 /kubepods /sys/fs/my\\040cgroup rw,relatime - cgroup2 cgroup2 rw\n"
        "22 1 0:21 / / rw - ext4 /dev/sda1 rw\n"
    )
    assert [(m.fstype, m.mount_point, m.root) for m in mounts] == [
        ("cgroup", "/sys/fs/cgroup/cpu,cpuacct", "/"),
        ("cgroup2", "/sys/fs/my cgroup", "/kubepods"),
    ]
    assert {"cpu", "cpuacct"} <= mounts[0].options


# -- whole machines ----------------------------------------------------------------------------


def test_zen3_avx2_only_says_what_follows(tmp_path: Path) -> None:
    info = system_info(zen3(tmp_path), affinity=range(16))
    assert info.cpu_model == "AMD EPYC 7763 64-Core Processor"
    assert (info.logical_cpus, info.physical_cores, info.sockets, info.threads_per_core) == (16, 8, 1, 2)
    assert info.flags == {"avx2", "fma", "f16c"}
    assert not (info.int8_accelerated or info.bf16_native or info.fp16_native)
    assert (info.cache_bytes(1), info.cache_bytes(2), info.cache_bytes(3)) == (32 << 10, 512 << 10, 32 << 20)
    assert info.numa_nodes == (NumaNode(0, tuple(range(16))),)
    notes = "\n".join(info.notes)
    assert "bf16: not available, runs as f32" in notes
    assert "int8: no VNNI, expect small gains" in notes
    assert "simd: AVX2 + FMA, no AVX-512" in notes
    assert "smt: 2 hardware threads per core (8 cores)" in notes
    assert "threads: budget 16 CPUs (cgroup quota none, affinity 16 of 16 CPUs)" in notes
    assert info.cgroup.version is None and info.cpu_budget == 16  # no cgroup files in this tree


def test_sapphire_rapids_with_amx(tmp_path: Path) -> None:
    info = system_info(sapphire_rapids(tmp_path), affinity=range(16))
    assert (info.logical_cpus, info.physical_cores, info.sockets) == (16, 8, 2)
    assert {"amx_tile", "amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx512_fp16", "avx512f"} <= info.flags
    assert info.int8_accelerated and info.bf16_native and info.fp16_native
    assert info.numa_nodes == (NumaNode(0, (0, 1, 2, 3, 8, 9, 10, 11)), NumaNode(2, (4, 5, 6, 7, 12, 13, 14, 15)))
    assert info.cache_bytes(3) == 105 << 20
    notes = "\n".join(info.notes)
    assert "int8: AMX (amx_int8, avx512_vnni, avx_vnni)" in notes
    assert "bf16: native (amx_bf16, avx512_bf16)" in notes
    assert "fp16: native (avx512_fp16)" in notes
    assert "numa: 2 nodes" in notes and "simd: AVX-512" in notes


def test_container_cpu_max_sets_the_budget(tmp_path: Path) -> None:
    root = zen3(tmp_path)
    cgroup_v2(root, cpu_max="150000 100000", memory_max="2147483648")
    info = system_info(root, affinity=[0, 1, 2, 3])
    assert info.cgroup.version == 2
    assert info.cgroup.cpu_quota_cpus == 1.5 and info.cgroup.memory_limit_bytes == 2 << 30
    assert info.cpu_budget == 1  # min(16 logical, 4 in the affinity mask, floor(1.5))
    assert info.memory_budget_bytes == 2 << 30
    notes = "\n".join(info.notes)
    assert "threads: budget 1 CPUs (cgroup quota 1.5 CPUs, affinity 4 of 16 CPUs)" in notes
    assert "memory: budget 2.0 GiB (cgroup limit 2.0 GiB" in notes


def test_affinity_bounds_the_budget_when_there_is_no_quota(tmp_path: Path) -> None:
    root = zen3(tmp_path)
    cgroup_v2(root, cpu_max="max 100000", memory_max="max")
    info = system_info(root, affinity=[2, 3, 4])
    assert info.cgroup.cpu_quota_cpus is None and info.cgroup.memory_limit_bytes is None
    assert info.cpu_budget == 3


def test_a_parent_cgroup_limit_binds_its_child(tmp_path: Path) -> None:
    root = zen3(tmp_path)
    write(root, "proc/self/cgroup", "0::/kubepods/pod1/ctr\n")
    write(root, "proc/self/mountinfo", "30 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    base = "sys/fs/cgroup/kubepods"
    write(root, f"{base}/pod1/ctr/cgroup.controllers", "cpu memory\n")
    write(root, f"{base}/pod1/ctr/cpu.max", "max 100000\n")
    write(root, f"{base}/pod1/ctr/memory.max", "max\n")
    write(root, f"{base}/pod1/cpu.max", "300000 100000\n")
    write(root, f"{base}/pod1/memory.max", "1073741824\n")
    write(root, f"{base}/cpu.max", "800000 100000\n")
    limits = read_cgroup_limits(root)
    assert limits.cpu_quota_cpus == 3.0 and limits.memory_limit_bytes == 1 << 30
    assert limits.cpu_path is not None and limits.cpu_path.endswith("kubepods/pod1")


def test_cgroup_v1_hybrid_host(tmp_path: Path) -> None:
    """cgroup2 mounted for systemd only; cpu and memory on v1 mounts (quota 2 CPUs, no memory limit)."""
    root = zen3(tmp_path)
    write(root, "proc/self/cgroup", "4:memory:/box/1\n2:cpu,cpuacct:/box/1\n0::/\n")
    write(
        root,
        "proc/self/mountinfo",
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
    )
    write(root, "sys/fs/cgroup/unified/cgroup.controllers", "\n")  # no controllers on v2
    write(root, "sys/fs/cgroup/cpu,cpuacct/box/1/cpu.cfs_quota_us", "200000\n")
    write(root, "sys/fs/cgroup/cpu,cpuacct/box/1/cpu.cfs_period_us", "100000\n")
    write(root, "sys/fs/cgroup/memory/box/1/memory.limit_in_bytes", "9223372036854771712\n")
    info = system_info(root, affinity=range(16))
    assert info.cgroup.version == 1
    assert info.cgroup.cpu_quota_cpus == 2.0 and info.cgroup.memory_limit_bytes is None
    assert info.cpu_budget == 2


def test_to_dict_is_plain_json_with_every_isa_flag(tmp_path: Path) -> None:
    info = system_info(sapphire_rapids(tmp_path), affinity=range(16))
    data = json.loads(json.dumps(info.to_dict()))
    assert list(data["isa"]) == list(ISA_FLAGS)
    assert data["isa"]["amx_int8"] is True and data["isa"]["asimddp"] is False
    assert data["l3_bytes"] == 105 << 20 and data["cpu_budget"] == 16
    assert data["numa_nodes"][1] == {"node": 2, "cpus": [4, 5, 6, 7, 12, 13, 14, 15]}
    assert data["notes"] == list(info.notes)


def test_this_machine_reads_without_error() -> None:
    """Whatever this machine is: the facts are consistent with each other (no ISA assumed)."""
    info = system_info()
    assert isinstance(info, SystemInfo)
    assert 1 <= info.cpu_budget <= info.logical_cpus
    assert info.physical_cores <= info.logical_cpus
    assert info.flags <= set(ISA_FLAGS)
    assert any(n.startswith("threads: budget ") for n in info.notes)
    json.dumps(info.to_dict())
