"""Host CPU facts: model, vendor, architecture, counts and maximum frequency.

Reads ``<root>/proc/cpuinfo`` and ``<root>/sys/devices/system/cpu/cpu*/cpufreq``; counts
come from the inventory sysfs discovery already built. On a live host ``platform`` and
``psutil`` fill gaps. Nothing here raises except :class:`ProbeUnavailable` when the
inventory has no CPUs at all.
"""

from __future__ import annotations

from discovery.readers import read_int, read_text
from discovery.root import Root
from discovery.words import plural
from plugins.base import ProbeContext, ProbeReport, ProbeUnavailable

__all__ = ["ARM_IMPLEMENTERS", "CpuProbe", "parse_cpuinfo"]

X86_VENDORS: dict[str, str] = {
    "GenuineIntel": "intel",
    "AuthenticAMD": "amd",
    "HygonGenuine": "hygon",
    "CentaurHauls": "centaur",
    "Shanghai": "zhaoxin",
}
ARM_IMPLEMENTERS: dict[int, str] = {
    0x41: "arm",
    0x42: "broadcom",
    0x43: "cavium",
    0x46: "fujitsu",
    0x48: "hisilicon",
    0x4E: "nvidia",
    0x50: "apm",
    0x51: "qualcomm",
    0x61: "apple",
    0x6D: "microsoft",
    0xC0: "ampere",
}
ARM_PARTS: dict[tuple[int, int], str] = {
    (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD40): "Neoverse-V1",
    (0x41, 0xD49): "Neoverse-N2",
    (0x41, 0xD4F): "Neoverse-V2",
    (0x41, 0xD84): "Neoverse-V3",
    (0x41, 0xD8E): "Neoverse-N3",
    (0x41, 0xD85): "Cortex-X925",
    (0x41, 0xD87): "Cortex-A725",
    (0x48, 0xD01): "Kunpeng-920",
    (0x50, 0x000): "X-Gene",
    (0xC0, 0xAC3): "AmpereOne",
}


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The first processor block's ``key : value`` pairs (plus later keys not seen before)."""
    out: dict[str, str] = {}
    # Blocks repeat per CPU (50 KB on a 128-CPU host); the first and the last block
    # (machine-wide trailer lines on Arm/POWER) hold every distinct key.
    blocks = text.split("\n\n")
    if len(blocks) > 2:
        text = blocks[0] + "\n" + blocks[-1]
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key and key not in out:
            out[key] = value.strip()
    return out


def _int(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(text.split()[0], 0)
    except (ValueError, IndexError):
        return None


def _facts(info: dict[str, str]) -> dict[str, str]:
    """cpu_vendor / cpu_model / arch from cpuinfo fields; absent keys when unknown."""
    out: dict[str, str] = {}
    vendor_id = info.get("vendor_id", "").strip()
    implementer = _int(info.get("CPU implementer"))
    model = info.get("model name") or info.get("Model Name")
    if vendor_id == "IBM/S390":
        out["cpu_vendor"] = "ibm"
        out["arch"] = "s390x"
    elif vendor_id:
        out["cpu_vendor"] = X86_VENDORS.get(vendor_id, vendor_id.lower())
        flags = info.get("flags", "").split()
        out["arch"] = "x86_64" if not flags or "lm" in flags else "i686"
    elif implementer is not None:
        out["cpu_vendor"] = ARM_IMPLEMENTERS.get(implementer, f"0x{implementer:02x}")
        arch_num = _int(info.get("CPU architecture"))
        out["arch"] = "aarch64" if arch_num is None or arch_num >= 8 else "armv7l"
        part = _int(info.get("CPU part"))
        if not model and part is not None:
            model = ARM_PARTS.get((implementer, part))
    elif info.get("arch", "").upper() == "IA-64":
        vendor = info.get("vendor", "").strip()
        if vendor:
            out["cpu_vendor"] = X86_VENDORS.get(vendor, vendor.lower())
        out["arch"] = "ia64"
    elif info.get("cpu", "").upper().startswith("POWER"):
        out["cpu_vendor"] = "ibm"
        out["arch"] = "ppc64le"
        model = model or info["cpu"].split(",")[0].strip()
    elif info.get("isa", "").startswith("rv"):
        out["arch"] = "riscv64" if info["isa"].startswith("rv64") else "riscv32"
        model = model or info.get("uarch")
    if model:
        out["cpu_model"] = " ".join(model.split())
    return out


def _freq_max_mhz(root: Root, cpus: list[int]) -> int | None:
    best: int | None = None
    base = root.sys_path("devices", "system", "cpu")
    for cpu in cpus:
        khz = read_int(f"{base}/cpu{cpu}/cpufreq/cpuinfo_max_freq")
        if khz is not None and khz > 0:
            best = max(best or 0, khz // 1000)
    if best is None and root.live:
        try:
            import psutil

            freq = psutil.cpu_freq()
            if freq is not None and freq.max and freq.max > 0:
                best = round(freq.max)
        except Exception:
            best = None
    return best


class CpuProbe:
    name = "cpu"

    def probe(self, ctx: ProbeContext) -> ProbeReport:
        host = ctx.host
        if not host.cpus:
            raise ProbeUnavailable("no CPUs in the inventory")
        report = ProbeReport()
        text = read_text(ctx.root.proc_path("cpuinfo"))
        facts = _facts(parse_cpuinfo(text)) if text else {}
        if text is None:
            report.warnings.append("cpu: /proc/cpuinfo is not readable")
        if ctx.live:
            try:
                import platform

                machine = platform.machine()
            except Exception:
                machine = ""
            if machine:
                facts["arch"] = machine
        report.host.update(facts)
        report.host["cpus_online"] = str(len(host.cpus))
        report.host["numa_nodes"] = str(len(host.numa_nodes))
        packages = {c.package for c in host.cpus if c.package is not None and c.package >= 0}
        if packages:
            report.host["sockets"] = str(len(packages))
        cores = {(c.package, c.core) for c in host.cpus if c.core is not None}
        if cores:
            report.host["cores"] = str(len(cores))
        mhz = _freq_max_mhz(ctx.root, sorted(c.id for c in host.cpus))
        if mhz is not None:
            report.host["cpu_freq_max_mhz"] = str(mhz)

        parts = [facts.get("cpu_model") or facts.get("cpu_vendor") or "unknown CPU"]
        if packages:
            parts.append(plural(len(packages), "socket"))
        parts.append(plural(len(host.cpus), "CPU"))
        parts.append(plural(len(host.numa_nodes), "NUMA node"))
        report.detail = ", ".join(parts)
        return report
