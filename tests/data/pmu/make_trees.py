"""Write the PMU description fixture trees (sysfs + procfs) under tests/data/pmu/.

Run ``python tests/data/pmu/make_trees.py`` after editing; the trees are committed.  Every
value comes from the kernel's own definitions (see README.md next to this file): format
strings from the ``DEFINE_UNCORE_FORMAT_ATTR``/``PMU_FORMAT_ATTR`` lines, event aliases and
their .scale/.unit from the ``INTEL_UNCORE_EVENT_DESC`` tables, generic core aliases from
``EVENT_ATTR_STR``/``intel_arch_events``/``amd_perfmon_event_map``.  The trees are trimmed:
4 CPUs in 2 sockets, 2 memory controllers and 2 IIO stacks per machine.
"""
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))

INTEL_CPU_FORMAT = {"event": "config:0-7", "umask": "config:8-15", "edge": "config:18", "pc": "config:19",
                    "inv": "config:23", "cmask": "config:24-31", "in_tx": "config:32", "in_tx_cp": "config:33",
                    "offcore_rsp": "config1:0-63", "ldlat": "config1:0-15", "frontend": "config1:0-23"}
INTEL_CPU_EVENTS = {"cpu-cycles": "event=0x3c", "instructions": "event=0xc0", "ref-cycles": "event=0x00,umask=0x03",
                    "branch-instructions": "event=0xc4", "branch-misses": "event=0xc5",
                    "bus-cycles": "event=0x3c,umask=0x01", "cache-references": "event=0x2e,umask=0x4f",
                    "cache-misses": "event=0x2e,umask=0x41", "mem-loads": "event=0xcd,umask=0x1,ldlat=3"}
UNCORE_FORMAT = {"event": "config:0-7", "umask": "config:8-15", "edge": "config:18", "inv": "config:23",
                 "thresh": "config:24-31"}
SKX_IIO_FORMAT = {"event": "config:0-7", "umask": "config:8-15", "edge": "config:18", "inv": "config:23",
                  "thresh": "config:24-35", "ch_mask": "config:36-43", "fc_mask": "config:44-46"}
FREERUNNING_FORMAT = {"event": "config:0-7", "umask": "config:8-15"}
MIB_64B = ("6.103515625e-5", "MiB")


def w(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text + "\n")


def pmu(root, name, typ, formats=None, events=None, cpumask=None, extra=None):
    d = os.path.join(root, "sys", "bus", "event_source", "devices", name)
    w(os.path.join(d, "type"), str(typ))
    if cpumask is not None:
        w(os.path.join(d, "cpumask"), cpumask)
    for k, v in (formats or {}).items():
        w(os.path.join(d, "format", k), v)
    for k, v in (events or {}).items():
        if isinstance(v, tuple):
            w(os.path.join(d, "events", k), v[0])
            w(os.path.join(d, "events", k + ".scale"), v[1])
            w(os.path.join(d, "events", k + ".unit"), v[2])
        else:
            w(os.path.join(d, "events", k), v)
    for k, v in (extra or {}).items():
        w(os.path.join(d, k), v)


def cpus(root, n=4, per_socket=2, hypervisor=False, vendor="GenuineIntel", family=6, model=85, name=""):
    w(os.path.join(root, "sys", "devices", "system", "cpu", "online"), f"0-{n - 1}")
    for c in range(n):
        w(os.path.join(root, "sys", "devices", "system", "cpu", f"cpu{c}", "topology", "physical_package_id"),
          str(c // per_socket))
    flags = "fpu vme de pse tsc msr pae mce cx8 apic sse sse2 avx avx2" + (" hypervisor" if hypervisor else "")
    blocks = []
    for c in range(n):
        blocks.append(f"processor\t: {c}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
                      f"model name\t: {name}\nphysical id\t: {c // per_socket}\nflags\t\t: {flags}\n")
    w(os.path.join(root, "proc", "cpuinfo"), "\n".join(blocks))


def software(root):
    pmu(root, "software", 1)
    pmu(root, "tracepoint", 2)
    pmu(root, "breakpoint", 5)
    pmu(root, "kprobe", 6, {"retprobe": "config:0"})
    pmu(root, "uprobe", 7, {"retprobe": "config:0"})
    pmu(root, "msr", 8, {"event": "config:0-63"}, {"tsc": "event=0x00", "aperf": "event=0x01", "mperf": "event=0x02"})


def pci_device(root, path, vendor, cls):
    """A PCI function under <sys>/devices/<path> and its <sys>/bus/pci/devices symlink (as the kernel links it)."""
    d = os.path.join(root, "sys", "devices", path)
    w(os.path.join(d, "vendor"), vendor)
    w(os.path.join(d, "class"), cls)
    link = os.path.join(root, "sys", "bus", "pci", "devices", os.path.basename(path))
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(os.path.relpath(d, os.path.dirname(link)), link)


def cascadelake(root):
    cpus(root, model=85, name="Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz")
    software(root)
    pmu(root, "cpu", 4, dict(INTEL_CPU_FORMAT, any="config:21"), INTEL_CPU_EVENTS)
    for i in range(2):
        pmu(root, f"uncore_imc_{i}", 14 + i, UNCORE_FORMAT,
            {"clockticks": "event=0x00,umask=0x00", "cas_count_read": ("event=0x04,umask=0x03",) + MIB_64B,
             "cas_count_write": ("event=0x04,umask=0x0c",) + MIB_64B}, "0,2")
    for i, (b0, b1) in enumerate((("0000:00", "0000:80"), ("0000:17", "0000:85"))):
        pmu(root, f"uncore_iio_{i}", 20 + i, SKX_IIO_FORMAT, {}, "0,2", {"die0": b0, "die1": b1})
        ev = {"ioclk": "event=0xff,umask=0x10"}
        for p in range(4):
            ev[f"bw_in_port{p}"] = (f"event=0xff,umask={0x20 + p:#04x}", "3.814697266e-6", "MiB")
            ev[f"bw_out_port{p}"] = (f"event=0xff,umask={0x24 + p:#04x}", "3.814697266e-6", "MiB")
        pmu(root, f"uncore_iio_free_running_{i}", 30 + i, FREERUNNING_FORMAT, ev, "0,2")
    # a GPU behind root bus 0000:17 (IIO stack 1, socket 0), a 3D controller behind 0000:85 and a NIC
    pci_device(root, "pci0000:17/0000:17:00.0/0000:18:00.0", "0x10de", "0x030200")
    pci_device(root, "pci0000:85/0000:85:02.0/0000:86:00.0", "0x10de", "0x030000")
    pci_device(root, "pci0000:85/0000:85:00.0/0000:3b:00.0", "0x15b3", "0x020700")


def cascadelake_programmed_iio(root):
    """Cascade Lake under a kernel without the SKX free-running IIO PMUs: only uncore_iio_N."""
    cascadelake(root)
    for i in range(2):
        shutil.rmtree(os.path.join(root, "sys", "bus", "event_source", "devices", f"uncore_iio_free_running_{i}"))


def icelake(root):
    cpus(root, model=106, name="Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz")
    software(root)
    pmu(root, "cpu", 4, INTEL_CPU_FORMAT, dict(INTEL_CPU_EVENTS, **{"topdown-retiring": "event=0x00,umask=0x80"}))
    for i in range(2):
        pmu(root, f"uncore_imc_{i}", 14 + i, UNCORE_FORMAT,
            {"clockticks": "event=0x01,umask=0x00", "cas_count_read": ("event=0x04,umask=0x0f",) + MIB_64B,
             "cas_count_write": ("event=0x04,umask=0x30",) + MIB_64B}, "0,2")
        pmu(root, f"uncore_imc_free_running_{i}", 18 + i, FREERUNNING_FORMAT,
            {"dclk": "event=0xff,umask=0x10", "read": ("event=0xff,umask=0x20",) + MIB_64B,
             "write": ("event=0xff,umask=0x21",) + MIB_64B}, "0,2")
    for i, (b0, b1) in enumerate((("0000:00", "0000:80"), ("0000:16", "0000:97"))):
        pmu(root, f"uncore_iio_{i}", 20 + i, dict(UNCORE_FORMAT, thresh="config:24-35", ch_mask="config:36-47",
                                                  fc_mask="config:48-50"), {}, "0,2", {"die0": b0, "die1": b1})
        ev = {"ioclk": "event=0xff,umask=0x10"}
        for p in range(8):
            ev[f"bw_in_port{p}"] = (f"event=0xff,umask={0x20 + p:#04x}", "3.0517578125e-5", "MiB")
        pmu(root, f"uncore_iio_free_running_{i}", 30 + i, FREERUNNING_FORMAT, ev, "0,2")


def zen3(root):
    cpus(root, vendor="AuthenticAMD", family=25, model=1, name="AMD EPYC 7763 64-Core Processor")
    software(root)
    pmu(root, "cpu", 4, {"event": "config:0-7,32-35", "umask": "config:8-15", "edge": "config:18",
                         "inv": "config:23", "cmask": "config:24-31"},
        {"cpu-cycles": "event=0x76", "instructions": "event=0xc0", "branch-instructions": "event=0xc2",
         "branch-misses": "event=0xc3", "stalled-cycles-frontend": "event=0xa9"})
    pmu(root, "amd_df", 11, {"event": "config:0-7,32-35,59-60", "umask": "config:8-15"}, {}, "0,2")
    pmu(root, "amd_l3", 12, {"event": "config:0-7", "umask": "config:8-15", "enallslices": "config:46",
                             "enallcores": "config:47", "sliceid": "config:48-50", "threadmask": "config:56-57"},
        {}, "0,2")
    pmu(root, "amd_iommu_0", 13, {"csource": "config:0-7", "devid": "config:8-23"}, {}, "0")


def zen4(root):
    cpus(root, vendor="AuthenticAMD", family=25, model=0x11, name="AMD EPYC 9654 96-Core Processor")
    software(root)
    pmu(root, "cpu", 4, {"event": "config:0-7,32-35", "umask": "config:8-15", "edge": "config:18",
                         "inv": "config:23", "cmask": "config:24-31"},
        {"cpu-cycles": "event=0x76", "instructions": "event=0xc0", "branch-instructions": "event=0xc2",
         "branch-misses": "event=0xc3"})
    pmu(root, "amd_df", 11, {"event": "config:0-7,32-37", "umask": "config:8-15,24-27"}, {}, "0,2")
    for i in range(2):
        pmu(root, f"amd_umc_{i}", 13 + i, {"event": "config:0-7", "rdwrmask": "config:8-9"}, {}, "0,2")


def vm(root):
    cpus(root, n=2, per_socket=2, hypervisor=True, model=85, name="Intel Xeon Processor (Cascadelake)")
    software(root)


if __name__ == "__main__":
    for name, fn in (("cascadelake", cascadelake), ("cascadelake_programmed_iio", cascadelake_programmed_iio), ("icelake", icelake), ("zen3", zen3), ("zen4", zen4), ("vm", vm)):
        root = os.path.join(HERE, name)
        shutil.rmtree(root, ignore_errors=True)
        fn(root)
        print("wrote", root)
