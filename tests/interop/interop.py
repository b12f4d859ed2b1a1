#!/usr/bin/env python3
"""uroce against the Linux kernel's Soft-RoCE driver (rdma_rxe), over a real bridge.

Debian 12 guests (stock kernel, stock rdma-core userland, booted from an initramfs under
qemu) and the host, which runs the unmodified Debian verbs programs over uroce's drop-in
libibverbs.so.1, sit on one bridge inside a network namespace this script creates and
removes. Every scenario runs in both directions (rxe server / uroce client and uroce
server / rxe client); one guest boot serves the whole run. Every exchange is captured on
the guest's tap and must decode in tshark without a malformed packet, with every ICRC
checked by `uroce decode`.

    interop.py build                  download the debs, assemble the guest image (cached)
    interop.py run [SCENARIO...]      build if needed, then run the scenarios (default all)
    interop.py guests [SCENARIO...]   the same scenarios guest to guest (rxe on both ends)
    interop.py record DIR             record the rxe wire fixtures (see crates/wire/tests/fixtures/rxe)
    interop.py list                   the scenario names

Needs root, /dev/net/tun, bridges and network namespaces, qemu-system-x86_64, tshark and
dumpcap. When they are missing it says so in one line and exits 1 under CI=true (0, loudly
skipped, otherwise). Environment: UROCE_INTEROP_WORK (cache, default /var/tmp/uroce-interop),
UROCE_INTEROP_LIB (the library to test, default target/release/liburoce_ffi.so),
UROCE_INTEROP_UROCE (the uroce binary, default target/release/uroce; the test command points
both at target/debug),
UROCE_INTEROP_ACCEL=auto|kvm|tcg, UROCE_INTEROP_VERBOSE=1 (echo guest consoles).
"""

import dataclasses
import gzip
import hashlib
import http.server
import lzma
import os
import re
import shlex
import shutil
import signal
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
WORK = Path(os.environ.get("UROCE_INTEROP_WORK", "/var/tmp/uroce-interop"))
SUBNET = "198.18.0"  # RFC 2544 benchmarking block, only ever inside our own namespace
HOST_IP = f"{SUBNET}.1"
GATE_PORT = 8790  # the guests poll http://HOST_IP:GATE_PORT/gate (see guest-init.sh)
STEP_LIMIT = 60  # seconds one program may run (a step takes 0.5-3 s under TCG on 2 busy cores)
SUITE_LIMIT = 540  # seconds of steps after which the remaining ones are failed unrun
MAX_BOOTS = 3  # guest boots per run: the first, and fresh ones after failed steps
VANISH_CLIENT_LIMIT = 8  # seconds a client whose server vanished may run
REJECT_SERVER_LIMIT = 4  # seconds the server of a `reject` scenario (listening elsewhere) runs
REJ_ATTR = 0x0012  # the CM REJ's MAD attribute ID
BOOT_LIMIT = 120  # seconds until a guest reports rxe0 up
KEEP_RUNS = 5  # earlier runs kept under WORK/runs


# --------------------------------------------------------------------------------------
# Scenarios, as data. `server` is the server's argument list; the client runs `client`
# (default: the server's arguments followed by the server's address). {gid} is the GID
# index of the side running it (uroce: 0, rxe: its RoCE v2 IPv4 GID), {peer} the server's
# address. `port` is the TCP port the server listens on (0: rdma_cm, no TCP socket).
# `uroce=False` keeps a scenario guest to guest until uroce interoperates on it (none now).
# `vanish=S`: the server is killed S seconds after it starts, in the middle of the
# exchange, and the client's transport retries are judged instead of exit statuses (see
# judge_vanish and docs/INTEROP.md). `one_way=True`: only the client sends RoCE packets
# (UD SEND bandwidth: no ACKs), so the capture must hold packets from the client alone.
# `reject=R`: the client connects (rdma_cm) to a port nobody listens on; the server's side
# must answer the REQ with a REJ and the client must exit with status R (ucmatose returns
# the REJ's reason: 8, invalid service ID). The server program listens on another port so
# that its end has an RDMA device (uroce's CM runs in the process) and is ended after
# REJECT_SERVER_LIMIT seconds.


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    server: str
    port: int = 18515
    client: str = ""
    uroce: bool = True
    vanish: int = 0
    one_way: bool = False
    reject: int = 0

    def server_limit(self):
        return self.vanish or (REJECT_SERVER_LIMIT if self.reject else STEP_LIMIT)

    def argv(self, role, gid, peer):
        text = self.server if role == "server" else (self.client or self.server + " {peer}")
        return [w.format(gid=gid, peer=peer) for w in shlex.split(text)]


PT = "-x {gid} -F -m 1024"  # perftest: GID index, no CPU-frequency check, path MTU 1024
SCENARIOS = [
    Scenario("rc_pingpong_1", "ibv_rc_pingpong -g {gid} -n 20 -s 1"),
    Scenario("rc_pingpong", "ibv_rc_pingpong -g {gid} -n 20"),
    Scenario("rc_pingpong_64k", "ibv_rc_pingpong -g {gid} -n 5 -s 65536"),
    Scenario("rc_pingpong_1m", "ibv_rc_pingpong -g {gid} -n 2 -s 1048576"),
    Scenario("rc_pingpong_chk", "ibv_rc_pingpong -g {gid} -n 10 -s 4097 -c"),
    Scenario("srq_pingpong", "ibv_srq_pingpong -g {gid} -n 20"),
    Scenario("send_lat", f"ib_send_lat {PT} -n 20"),
    Scenario("write_bw", f"ib_write_bw {PT} -n 20"),
    Scenario("read_bw", f"ib_read_bw {PT} -n 20"),
    Scenario("atomic_bw", f"ib_atomic_bw {PT} -n 20"),
    Scenario("atomic_cs_bw", f"ib_atomic_bw {PT} -n 20 -A CMP_AND_SWAP"),
    Scenario("write_peer_vanishes", f"ib_write_bw {PT} -s 1024 -t 4 -n 100000 --rate_limit=200 --rate_units=p "
             "--rate_limit_type=SW", vanish=4),
    Scenario("uc_pingpong", "ibv_uc_pingpong -g {gid} -n 20"),
    Scenario("uc_pingpong_chk", "ibv_uc_pingpong -g {gid} -n 10 -s 4096 -c"),
    Scenario("ud_pingpong", "ibv_ud_pingpong -g {gid} -n 20"),
    Scenario("ud_pingpong_1", "ibv_ud_pingpong -g {gid} -n 20 -s 1 -c"),
    Scenario("send_bw_ud", f"ib_send_bw {PT} -c UD -n 20", one_way=True),
    Scenario("send_lat_uc", f"ib_send_lat {PT} -c UC -n 20"),
    Scenario("write_bw_uc", f"ib_write_bw {PT} -c UC -n 20 -s 4096", one_way=True),
    Scenario("rping", "rping -s -a {peer} -C 5 -v", 0, "rping -c -a {peer} -C 5 -v"),
    Scenario("ucmatose", "ucmatose -b {peer} -c 1 -C 5", 0, "ucmatose -s {peer} -c 1 -C 5"),
    Scenario("udaddy", "udaddy -b {peer} -c 1 -C 5", 0, "udaddy -s {peer} -c 1 -C 5"),
    Scenario("ucmatose_reject", "ucmatose -b {peer} -p 7471 -c 1 -C 5", 0, "ucmatose -s {peer} -p 7472 -c 1 -C 5",
             reject=8),
]
BY_NAME = {s.name: s for s in SCENARIOS}


def log(msg):
    print(f"interop: {msg}", flush=True)


def die(msg):
    log(f"FAILED: {msg}")
    sys.exit(1)


def unavailable(msg):
    """The host cannot run the suite: one line; a failure under CI=true, else a skip."""
    if os.environ.get("CI") == "true":
        die(f"cannot run the rxe interop suite: {msg}")
    print(f"interop: SKIPPED (not CI): cannot run the rxe interop suite: {msg}", flush=True)
    sys.exit(0)


def sh(*argv, **kw):
    return subprocess.run(argv, check=True, text=True, capture_output=True, **kw).stdout


# --------------------------------------------------------------------------------------
# The guest image: Debian 12 packages fetched with `apt-get download` (never installed),
# unpacked with `dpkg-deb -x`, and packed into a gzip'd newc initramfs by this script.

PACKAGES = """busybox-static ibverbs-utils libibverbs1 ibverbs-providers librdmacm1 rdmacm-utils
perftest iproute2 libc6 libgcc-s1 libnl-3-200 libnl-route-3-200 libmnl0 libelf1 libbpf1 libcap2
libbsd0 libmd0 zlib1g libpci3 libibumad3 libudev1""".split()
PROGRAMS = """ibv_devinfo ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong ibv_srq_pingpong
ibv_xsrq_pingpong rping ucmatose udaddy ib_send_lat ib_send_bw ib_write_lat ib_write_bw
ib_read_lat ib_read_bw ib_atomic_lat ib_atomic_bw""".split()
# rxe and what it needs, the NIC, and rdma_cm. rxe 6.1 computes its ICRC with the kernel's
# "crc32" shash, which must be loaded before rxe.
MODULES = """virtio_pci virtio_net crc32_generic ib_core ib_uverbs rdma_rxe ib_cm iw_cm rdma_cm
rdma_ucm""".split()
LIB_DIRS = ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"]
IMAGE_VERSION = "1"  # bump when the image layout changes


class Cpio:
    """A newc ("070701") archive, as the kernel's initramfs unpacker reads it."""

    def __init__(self):
        self.out = bytearray()
        self.ino = 1
        self.dirs = set()

    def _entry(self, name, mode, data=b""):
        self.ino += 1
        fields = [self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
        self.out += b"070701" + b"".join(b"%08X" % f for f in fields)
        self.out += name.encode() + b"\0"
        self.out += b"\0" * (-len(self.out) % 4)
        self.out += data
        self.out += b"\0" * (-len(self.out) % 4)

    def _parents(self, path):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in self.dirs:
                self.dirs.add(d)
                self._entry(d, 0o040755)

    def dir(self, path):
        self._parents(path + "/x")

    def file(self, path, data, mode=0o644):
        self._parents(path)
        self._entry(path, 0o100000 | mode, data)

    def symlink(self, path, target):
        self._parents(path)
        self._entry(path, 0o120777, target.encode())

    def finish(self):
        self._entry("TRAILER!!!", 0)
        return bytes(self.out)


def needed(elf):
    out = sh("readelf", "-d", str(elf))
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def kernel_abi():
    out = sh("apt-cache", "depends", "linux-image-amd64")
    m = re.search(r"Depends: linux-image-(\d[^\s]*)", out)
    if not m:
        die("apt-cache cannot resolve linux-image-amd64 (run apt-get update)")
    return m.group(1)


def download(debs, packages):
    debs.mkdir(parents=True, exist_ok=True)
    missing = [p for p in packages if not list(debs.glob(f"{p}_*.deb"))]
    if not missing:
        return
    log(f"apt-get download {' '.join(missing)}")
    for attempt in range(2):
        r = subprocess.run(["apt-get", "download", *missing], cwd=debs, capture_output=True, text=True)
        if r.returncode == 0:
            return
        if attempt == 0:
            subprocess.run(["apt-get", "update", "-qq"], check=False)
    die(f"apt-get download failed: {r.stderr.strip()[-400:]}")


def build_image():
    """Returns (vmlinux, initramfs, manifest) under WORK/image-KEY, building them once."""
    kver = os.environ.get("UROCE_INTEROP_KVER") or kernel_abi()
    packages = [f"linux-image-{kver}", *PACKAGES]
    debs = WORK / "debs"
    download(debs, packages)
    files = [sorted(debs.glob(f"{p}_*.deb"))[-1] for p in packages]
    key = hashlib.sha256(
        "\n".join([IMAGE_VERSION, *(f.name for f in files), *PROGRAMS, *MODULES]).encode()
        + (HERE / "guest-init.sh").read_bytes()
    ).hexdigest()[:12]
    image = WORK / f"image-{key}"
    vmlinux, initrd, manifest = image / "vmlinux", image / "initramfs.gz", image / "manifest.txt"
    if initrd.exists():
        return vmlinux, initrd, manifest
    t0 = time.monotonic()
    stage = WORK / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    lines = []
    for f in files:
        sh("dpkg-deb", "-x", str(f), str(stage))
        lines.append(sh("dpkg-deb", "-f", str(f), "Package", "Version").replace("Package: ", "").replace("\nVersion: ", " ").strip())
    arc = Cpio()
    for d in ["proc", "sys", "dev", "tmp", "root", "etc", "usr/bin", "usr/sbin", "sbin"]:
        arc.dir(d)

    busybox = stage / "bin/busybox"
    arc.file("bin/busybox", busybox.read_bytes(), 0o755)
    skip = {"usr/bin/" + p for p in PROGRAMS} | {"bin/busybox", "sbin/init", "init"}
    for applet in sh(str(busybox), "--list-full").split():
        if applet not in skip:
            arc.symlink(applet, "/bin/busybox")

    def find_lib(soname):
        for d in LIB_DIRS:
            if (stage / d / soname).exists():
                return stage / d / soname
        die(f"{soname} is in none of the downloaded packages: add its package to PACKAGES")

    elves = []
    for p in PROGRAMS:
        src = stage / "usr/bin" / p
        if not src.exists():
            die(f"{p} is in none of the downloaded packages")
        arc.file(f"usr/bin/{p}", src.read_bytes(), 0o755)
        elves.append(src)
    rdma = stage / "usr/bin/rdma"
    arc.file("usr/sbin/rdma", rdma.read_bytes(), 0o755)
    elves.append(rdma)
    provider = stage / "usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so"
    arc.file("usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so", provider.read_bytes(), 0o755)
    arc.file("etc/libibverbs.d/rxe.driver", (stage / "etc/libibverbs.d/rxe.driver").read_bytes())
    elves.append(provider)
    # glibc dlopen()s libgcc_s for thread cancellation (rping's threads exit through it).
    seen = {"libgcc_s.so.1"}
    queue = [*elves, find_lib("libgcc_s.so.1")]
    arc.file("lib/x86_64-linux-gnu/libgcc_s.so.1", find_lib("libgcc_s.so.1").read_bytes(), 0o755)
    while queue:
        for so in needed(queue.pop()):
            if so in seen:
                continue
            seen.add(so)
            src = find_lib(so)
            arc.file(f"lib/x86_64-linux-gnu/{so}", src.resolve().read_bytes(), 0o755)
            queue.append(src)
    arc.symlink("lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")

    moddir = f"lib/modules/{kver}"
    paths = {}
    for ko in (stage / moddir).rglob("*.ko"):
        paths[ko.name[:-3].replace("-", "_")] = ko
    builtin = (stage / moddir / "modules.builtin").read_text()
    order = []

    def place(name):
        name = name.replace("-", "_")
        ko = paths.get(name)
        if ko is None:
            if re.search(rf"/{re.escape(name).replace('_', '[-_]')}\.ko$", builtin, re.M):
                return
            die(f"module {name} is not in linux-image-{kver}")
        if ko in order:
            return
        for dep in filter(None, sh("modinfo", "-F", "depends", str(ko)).strip().split(",")):
            place(dep)
        order.append(ko)

    for m in MODULES:
        place(m)
    for ko in order:
        arc.file(str(ko.relative_to(stage)), ko.read_bytes())
    arc.file("etc/interop/modules", "".join(f"/{ko.relative_to(stage)}\n" for ko in order).encode())
    arc.file("etc/interop/manifest.txt", "\n".join(lines).encode() + b"\n")
    arc.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    arc.file("etc/group", b"root:x:0:\n")
    arc.file("init", (HERE / "guest-init.sh").read_bytes(), 0o755)

    tmp = WORK / f"image-{key}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "initramfs.gz").write_bytes(gzip.compress(arc.finish(), 6, mtime=0))
    # qemu boots the uncompressed ELF kernel through its PVH entry point: under TCG that
    # skips the real-mode set-up and the in-kernel xz decompression (about half the boot).
    bz = (stage / f"boot/vmlinuz-{kver}").read_bytes()
    at = bz.find(b"\xfd7zXZ\x00")
    elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(bz[at:]) if at >= 0 else b""
    if elf[:4] != b"\x7fELF":
        die("the kernel image holds no xz-compressed ELF")
    (tmp / "vmlinux").write_bytes(elf)
    (tmp / "manifest.txt").write_text("\n".join(lines) + "\n")
    shutil.rmtree(image, ignore_errors=True)
    tmp.rename(image)
    shutil.rmtree(stage, ignore_errors=True)
    log(f"built {image} ({(image / 'initramfs.gz').stat().st_size >> 10} KiB initramfs, modules: "
        f"{' '.join(k.name[:-3] for k in order)}) in {time.monotonic() - t0:.1f} s")
    return vmlinux, initrd, manifest


# --------------------------------------------------------------------------------------
# Running: the namespace, guests, captures, host programs, steps.


def accelerator():
    want = os.environ.get("UROCE_INTEROP_ACCEL", "auto")
    if want in ("kvm", "tcg"):
        return want
    # A /dev/kvm backed by kvm_pvm (a paravirtualised KVM inside another VM) runs a stock
    # kernel through its instruction emulator: minutes per boot, then emulation failures.
    if not os.access("/dev/kvm", os.W_OK) or Path("/sys/module/kvm_pvm").exists():
        return "tcg"
    r = subprocess.run(["qemu-system-x86_64", "-accel", "kvm", "-M", "pc", "-nodefaults", "-display",
                        "none", "-S", "-monitor", "stdio"], input="q\n", capture_output=True, text=True,
                       timeout=30)
    return "kvm" if r.returncode == 0 else "tcg"


class Gate(http.server.BaseHTTPRequestHandler):
    """GET /gate answers the number of the step whose client may start, or "none"."""

    step = None

    def do_GET(self):
        body = str(Gate.step).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class GateServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True  # a later guest boot binds it again
    daemon_threads = True


class Proc:
    """A process of ours, its output in a file, ended by its PID when it overstays."""

    def __init__(self, argv, out, env=None, limit=STEP_LIMIT):
        self.out = out
        with open(out, "w") as f:
            self.p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=env, start_new_session=True)
        self.deadline = time.monotonic() + limit

    def poll(self):
        rc = self.p.poll()
        if rc is None and time.monotonic() > self.deadline:
            self.stop()
            return "timeout"
        return rc

    def stop(self, sig=signal.SIGKILL):
        if self.p.poll() is None:
            os.killpg(self.p.pid, sig)
        try:
            return self.p.wait(10)
        except subprocess.TimeoutExpired:
            return None

    def text(self):
        return Path(self.out).read_text(errors="replace")


class Guest:
    def __init__(self, name, octet, image, rundir, accel):
        self.name, self.ip, self.tap = name, f"{SUBNET}.{octet}", f"tap{octet}"
        self.image, self.rundir, self.accel = image, rundir, accel
        self.console = rundir / f"{name}.console"
        self.plan = []
        self.proc = None

    def serve(self, step, scen, peer):
        words = " ".join(shlex.quote(w) for w in scen.argv("server", "@GID@", peer)).replace("@GID@", "$GID")
        self.plan.append(f"serve {step} {scen.port} {scen.server_limit()} {words}")

    def connect(self, step, scen, peer):
        words = " ".join(shlex.quote(w) for w in scen.argv("client", "@GID@", peer)).replace("@GID@", "$GID")
        self.plan.append(f"connect {step} {VANISH_CLIENT_LIMIT if scen.vanish else STEP_LIMIT} {words}")

    def boot(self):
        vmlinux, initrd, _ = self.image
        plan = Cpio()
        plan.file("plan.sh", ("\n".join(self.plan) + "\n").encode())
        # An uncompressed archive first, the cached gzip'd image after: the kernel unpacks both.
        per_boot = self.rundir / f"{self.name}.initramfs"
        per_boot.write_bytes(plan.finish() + initrd.read_bytes())
        subprocess.run(["ip", "tuntap", "add", "dev", self.tap, "mode", "tap"], check=True)
        subprocess.run(["ip", "link", "set", self.tap, "master", "br0", "up"], check=True)
        accel, cpu = ("kvm", "host") if self.accel == "kvm" else ("tcg,thread=multi", "max")
        mac = "52:54:00:19:00:%02x" % int(self.ip.rsplit(".", 1)[1])
        append = (f"console=ttyS0 panic=-1 quiet uroce.name={self.name} uroce.ip={self.ip}/24 "
                  f"uroce.host={HOST_IP}")
        # -nodefaults: the tap is the guest's only NIC (never a user-mode one).
        argv = ["qemu-system-x86_64", "-name", f"interop-{self.name}", "-accel", accel, "-cpu", cpu,
                "-M", "pc", "-m", "512", "-smp", "1", "-nodefaults", "-no-user-config", "-nographic",
                "-no-reboot", "-serial", "stdio", "-monitor", "none", "-kernel", str(vmlinux),
                "-initrd", str(per_boot), "-append", append,
                "-netdev", f"tap,id=n0,ifname={self.tap},script=no,downscript=no",
                "-device", f"virtio-net-pci,netdev=n0,mac={mac},romfile="]
        self.t0 = time.monotonic()
        self.proc = Proc(argv, self.console)
        self.proc.deadline = time.monotonic() + BOOT_LIMIT + STEP_LIMIT * (len(self.plan) + 1)

    def lines(self):
        try:
            return self.console.read_text(errors="replace").replace("\r", "").splitlines()
        except FileNotFoundError:
            return []

    def marker(self, pattern):
        rx = re.compile(rf"^@@{re.escape(self.name)} ({pattern})$")
        for line in self.lines():
            m = rx.match(line)
            if m:
                return m
        return None

    def wait(self, pattern, limit):
        end = time.monotonic() + limit
        while time.monotonic() < end:
            m = self.marker(pattern)
            if m:
                return m
            fail = self.marker(r"fail=.*")
            if fail or self.proc.poll() is not None:
                return None
            time.sleep(0.05)
        return None

    def output(self, step):
        tag = f"[{self.name}.{step}] "
        return "\n".join(l[len(tag):] for l in self.lines() if l.startswith(tag))


def socket_inodes(pid):
    """The inodes of the sockets process `pid` holds (empty when it is gone)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                m = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
            except OSError:
                continue
            if m:
                inodes.add(m.group(1))
    except OSError:
        pass
    return inodes


def listening(port, pid=None):
    """Whether a TCP socket listens on `port` in this namespace. Port 0 (a program that
    listens through rdma_cm): whether a UDP socket is bound to the RoCEv2 port, which the
    uroce device opens when the program binds its id, just before it listens; with `pid`,
    a socket of that process (the host's other uroce processes share the port)."""
    want = f":{port or 4791:04X}"
    files = ("/proc/net/tcp", "/proc/net/tcp6") if port else ("/proc/net/udp", "/proc/net/udp6")
    mine = socket_inodes(pid) if pid is not None and not port else None
    for f in files:
        for line in Path(f).read_text().splitlines()[1:]:
            w = line.split()
            if len(w) > 9 and w[1].endswith(want) and (w[3] == "0A" or not port):
                if mine is None or w[9] in mine:
                    return True
    return False


BYSTANDER_PORT = 18599  # the TCP port of the bystander pair's out-of-band exchange
BYSTANDER_PAUSE = 1.0  # seconds between two bystander pairs


class Bystander:
    """Two more uroce processes on the host's one address for the whole run: an
    `ibv_rc_pingpong` pair, server and client both on HOST_IP, again and again. Every step's
    uroce program is then one of three processes sharing the host's device (one UDP 4791
    through SO_REUSEPORT, docs/ARCHITECTURE.md "Shared devices"), so rxe's packets and CM
    MADs must be steered to the process that owns their QP or connection, while the pair's
    traffic must not be disturbed. Every pair must succeed."""

    def __init__(self, env, rundir):
        self.env, self.rundir = env, rundir
        self.ok, self.failed, self.stop_flag = 0, [], threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        argv = ["ibv_rc_pingpong", "-g", "0", "-n", "100", "-s", "1024", "-p", str(BYSTANDER_PORT)]
        n = 0
        while not self.stop_flag.is_set():
            n += 1
            out = self.rundir / f"bystander-{n:03d}"
            server = Proc(argv, out.with_suffix(".server.out"), self.env, STEP_LIMIT)
            end = time.monotonic() + 30
            while not listening(BYSTANDER_PORT) and server.p.poll() is None and time.monotonic() < end:
                time.sleep(0.02)
            client = Proc(argv + [HOST_IP], out.with_suffix(".client.out"), self.env, STEP_LIMIT)
            rcs = []
            for p in (client, server):
                while (rc := p.poll()) is None:
                    time.sleep(0.05)
                rcs.append(rc)
            if rcs == [0, 0]:
                self.ok += 1
            else:
                self.failed.append(f"pair {n}: client exit {rcs[0]}, server exit {rcs[1]} ({out}.*.out)")
            self.stop_flag.wait(BYSTANDER_PAUSE)

    def finish(self):
        """Stops after the pair in progress; returns why the bystanders failed, or None."""
        self.stop_flag.set()
        self.thread.join(2 * STEP_LIMIT + 40)
        log(f"bystander pairs on {HOST_IP}: {self.ok} ok, {len(self.failed)} failed")
        if self.failed:
            return "; ".join(self.failed[:5])
        if self.ok == 0:
            return "no bystander pair completed"
        return None


class Capture:
    def __init__(self, iface, pcap):
        self.pcap = pcap
        self.err = pcap.with_suffix(".dumpcap")
        with open(self.err, "w") as e:
            self.p = subprocess.Popen(["dumpcap", "-q", "-P", "-i", iface, "-f", "udp port 4791", "-w", str(pcap)],
                                      stdout=subprocess.DEVNULL, stderr=e, start_new_session=True)
        end = time.monotonic() + 10
        while time.monotonic() < end and "Capturing" not in self.err.read_text():
            time.sleep(0.02)

    def stop(self):
        time.sleep(0.2)  # the last ACK
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


# tshark guesses at the upper protocol of SEND payloads; pingpong payloads are arbitrary
# bytes, which some guessers misread ("Malformed Packet: RPCoRDMA" on a 1-byte SEND), so the
# guessers are off and the RoCEv2 headers alone are judged.
NO_PAYLOAD_GUESSES = [a for p in ("rpcordma", "smc", "smb_direct", "nvme-rdma", "lnet", "iser", "eoib",
                                  "infiniband_sdp", "fcoib") for a in ("--disable-protocol", p)]


def check_capture(pcap, uroce, ends):
    """Problems with a capture: packets, tshark's decode, the ICRCs, both ends talking."""
    if not pcap.exists():
        return ["no capture"], 0
    problems = []
    rows = subprocess.run(["tshark", "-n", *NO_PAYLOAD_GUESSES, "-r", str(pcap), "-T", "fields", "-e", "ip.src", "-e", "_ws.malformed",
                           "-e", "infiniband.bth.opcode"], capture_output=True, text=True)
    if rows.returncode != 0:
        return [f"tshark: {rows.stderr.strip()}"], 0
    lines = [l.split("\t") for l in rows.stdout.splitlines()]
    if not lines:
        return ["no packets captured"], 0
    if any(l[1] for l in lines):
        problems.append(f"{sum(1 for l in lines if l[1])} malformed packets")
    if any(not l[2] for l in lines):
        problems.append(f"{sum(1 for l in lines if not l[2])} packets tshark does not decode as RoCE")
    missing = set(ends) - {l[0] for l in lines}
    if missing:
        problems.append(f"no packet from {', '.join(sorted(missing))}")
    d = subprocess.run([str(uroce), "decode", str(pcap)], capture_output=True, text=True)
    summary = (d.stdout.strip().splitlines() or ["?"])[-1]
    if d.returncode != 0 or f"{len(lines)} RoCEv2 packets (0 bad)" not in summary:
        bad = [l for l in d.stdout.splitlines() if " error: " in l][:3]
        problems.append(f"uroce decode: {summary} {bad}")
    return problems, len(lines)


def checker_catches_corruption(step, rundir, uroce):
    """The capture check must be able to fail: one bit flipped in the last byte of the
    first packet of a passing capture (inside its ICRC) must be reported."""
    pcap = sorted(rundir.glob(f"{step.number:02d}-*.pcap"))[0]
    data = bytearray(pcap.read_bytes())
    # pcap: 24-byte file header, 16-byte record header (incl_len at offset 8), the frame.
    incl = int.from_bytes(data[24 + 8:24 + 12], "little")
    data[24 + 16 + incl - 1] ^= 0x01
    bad = rundir / "corrupted.pcapx"
    bad.write_bytes(data)
    problems, _ = check_capture(bad, uroce, set())
    bad.unlink()
    if not any("uroce decode" in p for p in problems):
        log(f"FAILED: a capture with a corrupted ICRC passed the check ({pcap.name})")
        return False
    log(f"check of the checks: one bit flipped in {pcap.name} is reported ({problems[-1][:60]}...)")
    return True


@dataclasses.dataclass
class Step:
    number: int
    scen: Scenario
    server: object  # "host" or a Guest
    client: object

    @property
    def label(self):
        side = lambda s: "uroce" if s == "host" else f"rxe({s.name})"
        return f"{self.scen.name} [{side(self.server)} server, {side(self.client)} client]"


def run_steps(steps, guests, lib, uroce, rundir, end):
    """Runs the steps in order until one fails or time `end` comes; returns
    [(step, ok, seconds, packets, why)] for those it ran."""
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib.parent), UROCE_ADDR=HOST_IP)
    env.pop("UROCE_FAULTS", None)
    env.pop("UROCE_SHARED", None)  # the host's device, shared with the bystander pair
    ip_of = lambda side: HOST_IP if side == "host" else side.ip
    for s in steps:
        if s.server != "host":
            s.server.serve(s.number, s.scen, s.server.ip)
        if s.client != "host":
            s.client.connect(s.number, s.scen, ip_of(s.server))
    gate = GateServer((HOST_IP, GATE_PORT), Gate)
    threading.Thread(target=gate.serve_forever, daemon=True).start()
    results = []
    try:
        for g in guests:
            g.boot()
        for g in guests:
            m = g.wait(r"up gid=\d+ .*", BOOT_LIMIT)
            if not m:
                tail = "\n".join(g.lines()[-15:])
                die(f"guest {g.name} did not bring rxe0 up:\n{tail}")
            log(f"guest {g.name} ({g.ip}, {g.accel}): {m.group(1)} after {time.monotonic() - g.t0:.1f} s")
        for s in steps:
            if time.monotonic() > end:
                break
            results.append(run_step(s, env, lib, uroce, rundir, ip_of))
            if not results[-1][1]:
                return results
        for g in guests:
            g.wait("done", 30)
            (rundir / f"{g.name}.initramfs").unlink(missing_ok=True)
    finally:
        gate.shutdown()
        gate.server_close()
        for g in guests:
            if g.proc:
                try:  # a guest that is done powers off by itself
                    g.proc.p.wait(5 if g.marker("done") else 0.1)
                except subprocess.TimeoutExpired:
                    pass
                g.proc.stop()
    return results


def run_step(s, env, lib, uroce, rundir, ip_of):
    t0 = time.monotonic()
    name = f"{s.number:02d}-{s.scen.name}-{'uroce' if s.server == 'host' else 'rxe'}-server"
    tapped = s.server if s.server != "host" else s.client
    cap = Capture(tapped.tap, rundir / f"{name}.pcap")
    host_procs, why = {}, []
    peer = ip_of(s.server)
    if s.server == "host":
        host_procs["server"] = Proc(s.scen.argv("server", "0", peer), rundir / f"{name}.server.out", env,
                                    s.scen.server_limit())
        end = time.monotonic() + 30
        pid = host_procs["server"].p.pid
        while not listening(s.scen.port, pid) and host_procs["server"].p.poll() is None and time.monotonic() < end:
            time.sleep(0.02)
        if not listening(s.scen.port, pid):
            why.append("the uroce server never listened")
        elif s.scen.port == 0:
            time.sleep(0.5)  # from binding its id to listening (the guest gives rxe 1 s)
    elif not s.server.wait(rf"step={s.number} listen", STEP_LIMIT):
        why.append("the rxe server never listened")
    if not why:
        if s.client == "host":
            host_procs["client"] = Proc(s.scen.argv("client", "0", peer), rundir / f"{name}.client.out", env,
                                        VANISH_CLIENT_LIMIT if s.scen.vanish else STEP_LIMIT)
        else:
            Gate.step = s.number
    rcs = {}
    for role, side in (("server", s.server), ("client", s.client)):
        if side == "host":
            p = host_procs.get(role)
            if p is None:
                continue
            while (rc := p.poll()) is None:
                time.sleep(0.02)
            rcs[role] = rc
        elif not why or role == "server":
            m = side.wait(rf"step={s.number} rc=\d+", STEP_LIMIT + 15)
            rcs[role] = int(m.group(1).split("=")[-1]) if m else "no result"
    Gate.step = None
    cap.stop()
    ends = {ip_of(s.client)} if s.scen.one_way else {ip_of(s.server), ip_of(s.client)}
    problems, packets = check_capture(cap.pcap, uroce, ends)
    why += problems
    outputs = {}
    for role, side in (("server", s.server), ("client", s.client)):
        outputs[role] = host_procs[role].text() if side == "host" and role in host_procs else (
            side.output(s.number) if side != "host" else "")
    if s.scen.reject:
        verdict, problem = judge_reject(s, rcs, cap.pcap, ip_of(s.server))
        why += [problem] if problem else []
    elif s.scen.vanish:
        verdict, problem = judge_vanish(s, rcs, outputs["client"], cap.pcap, ip_of(s.client))
        why += [problem] if problem else []
    else:
        verdict = ""
        why += [f"{role} exit {rc}" for role, rc in rcs.items() if rc != 0]
    (rundir / f"{name}.log").write_text("".join(f"--- {r}:\n{t}\n" for r, t in outputs.items()))
    secs = time.monotonic() - t0
    status = "ok  " if not why else "FAIL"
    log(f"{status} {s.label}: {secs:.1f} s, {packets} packets{verdict}{'; ' + '; '.join(why) if why else ''}")
    if why:
        for role, text in outputs.items():
            print(f"    --- {role} output:\n" + "\n".join("    " + l for l in text.splitlines()[-20:]), flush=True)
    return s, not why, secs, packets, why


def judge_reject(s, rcs, pcap, server_ip):
    """The client connected to a port nobody listens on: the server's end must have sent a
    CM REJ and the client must exit with the expected status; the server (listening on
    another port) is ended by its time limit."""
    rejs = sh("tshark", "-n", "-r", str(pcap), "-Y",
              f"ip.src == {server_ip} && infiniband.mad.attributeid == {REJ_ATTR:#06x}",
              "-T", "fields", "-e", "frame.number").split()
    verdict = f", {len(rejs)} REJ"
    if not rejs:
        return verdict, "no CM REJ from the server's end"
    if rcs.get("client") != s.scen.reject:
        return verdict, f"client exit {rcs.get('client')}, expected {s.scen.reject} (rejected)"
    if rcs.get("server") not in ("timeout", 124, 143):  # host; coreutils, busybox timeout
        return verdict, f"server exit {rcs.get('server')}, expected to be ended by its limit"
    return verdict, None


RETRY_CNT = 7  # what ibv_rc_pingpong sets (and perftest); IBA: 7 retries, then an error
ACK_TIMEOUT_S = 4.096e-6 * 2 ** 14  # perftest's Local ACK Timeout (code 14, about 67 ms)


def judge_vanish(s, rcs, client_out, pcap, client_ip):
    """The server died mid-stream. uroce (IBA: retry_cnt counts retries; 7 is seven) must
    send the first unacknowledged packet exactly 1 + 7 times and then fail (the work
    request completes with IBV_WC_RETRY_EXC_ERR, perftest exits 1); Linux rxe is known to
    treat retry_cnt 7 as infinite and must still be retransmitting when its time limit
    kills it (more than 1 + 7 times)."""
    lines = sh("tshark", "-n", "-r", str(pcap), "-Y", f"ip.src == {client_ip} && infiniband.bth.opcode != 17",
               "-T", "fields", "-e", "infiniband.bth.psn", "-e", "frame.time_epoch").splitlines()
    sends = {}
    for line in lines:
        f = line.split()
        if len(f) == 2:
            sends.setdefault(f[0], []).append(float(f[1]))
    times = max(sends.values(), key=len, default=[])
    most = len(times)
    verdict = f", a packet sent {most} times"
    rc = rcs.get("client")
    if s.client == "host":
        if rc in (0, "timeout"):
            return verdict, f"uroce client: exit {rc}, expected a failure before its limit"
        # A retransmit timer that fired late (more than half a period: the host did not
        # schedule the client, which shares its 2 cores with two guests) is excused by
        # uroce and does not consume a retry (docs/ARCHITECTURE.md, the RC engine): the
        # capture shows it as a gap of more than 1.5 periods. Every other send counts.
        late = sum(1 for a, b in zip(times, times[1:]) if b - a > 1.4 * ACK_TIMEOUT_S)
        allowed = 1 + RETRY_CNT + min(late, RETRY_CNT)
        if not 1 + RETRY_CNT <= most <= allowed:
            return verdict, (f"uroce sent a packet {most} times with retry_cnt {RETRY_CNT} and {late} late "
                             f"timer(s), expected {1 + RETRY_CNT}" + (f" to {allowed}" if late else ""))
        if late:
            verdict += f" ({late} after a late timer)"
        return verdict + " (uroce: retry_cnt 7 = seven retries, then RETRY_EXC_ERR)", None
    if rc not in (124, 143):
        return verdict, f"rxe client: exit {rc}, expected to be still retrying when its limit killed it"
    if most <= 1 + RETRY_CNT:
        return verdict, f"rxe sent a packet only {most} times: does it no longer retry forever?"
    return verdict + " (rxe: retry_cnt 7 = forever, killed by its limit)", None


def inside(args):
    """Runs inside the namespace: args = [mode, rundir, lib, uroce, vmlinux, initramfs, names...]."""
    mode, rundir, lib, uroce, vmlinux, initrd, *names = args
    rundir, lib, uroce = Path(rundir), Path(lib), Path(uroce)
    image = (Path(vmlinux), Path(initrd), None)
    accel = accelerator()
    scens = [BY_NAME[n] for n in names]
    if mode == "run":
        g = Guest("rxe1", 2, image, rundir, accel)
        guests, steps = [g], []
        for sc in scens:
            steps.append(Step(len(steps) + 1, sc, g, "host"))
            steps.append(Step(len(steps) + 1, sc, "host", g))
    else:
        a, b = Guest("rxeA", 2, image, rundir, accel), Guest("rxeB", 3, image, rundir, accel)
        guests = [a, b]
        steps = [Step(i + 1, sc, a, b) for i, sc in enumerate(scens)]
    # Steps run in order in one boot until one fails; the rest, that step first, then run
    # in freshly booted guests (an emulated NIC that stops transmitting under a loaded TCG
    # host fails every later step). A step fails the suite when it fails twice.
    pending = [(s.scen, s.server != "host", s.client != "host") for s in steps]
    results, failed_once, number, boot = [], set(), 0, 0
    end = time.monotonic() + SUITE_LIMIT
    bystander = None
    if mode == "run":
        env = dict(os.environ, LD_LIBRARY_PATH=str(lib.parent), UROCE_ADDR=HOST_IP)
        env.pop("UROCE_FAULTS", None)
        env.pop("UROCE_SHARED", None)
        bystander = Bystander(env, rundir)
    while pending and boot < MAX_BOOTS and time.monotonic() < end:
        boot += 1
        if mode == "run":
            guests = [Guest(f"rxe{boot}", 1 + boot, image, rundir, accel)]
        else:
            guests = [Guest(f"rxeA{boot}", 2 * boot, image, rundir, accel),
                      Guest(f"rxeB{boot}", 2 * boot + 1, image, rundir, accel)]
        steps = []
        for sc, guest_server, guest_client in pending:
            number += 1
            steps.append(Step(number, sc, guests[0] if guest_server else "host",
                              guests[-1] if guest_client else "host"))
        if os.environ.get("UROCE_INTEROP_VERBOSE") == "1":
            threading.Thread(target=echo_consoles, args=(guests,), daemon=True).start()
        ran = run_steps(steps, guests, lib, uroce, rundir, end)
        pending = pending[len(ran):]
        for r in ran:
            key = (r[0].scen, r[0].server != "host", r[0].client != "host")
            if r[1] or key in failed_once:
                results.append(r)
            else:
                failed_once.add(key)
                pending.insert(0, key)
                log(f"retrying {r[0].label} and the steps after it in a fresh guest")
    for sc, guest_server, guest_client in pending:
        log(f"FAIL {sc.name}: not run (time or guest boots spent)")
        results.append((None, False, 0.0, 0, ["not run"]))
    if bystander is not None and (why := bystander.finish()):
        log(f"FAIL bystander pairs: {why}")
        results.append((None, False, 0.0, 0, [why]))
    failed = [r for r in results if not r[1]]
    retried = [r[0].label for r in results if r[1] and (r[0].scen, r[0].server != "host",
                                                         r[0].client != "host") in failed_once]
    if results and not failed and not checker_catches_corruption(results[0][0], rundir, uroce):
        return 1
    if retried:
        log(f"WARNING: passed only on a retry in a fresh guest: {', '.join(retried)}")
    log(f"{len(results) - len(failed)}/{len(results)} steps passed in {boot} guest boot(s); "
        f"captures and logs in {rundir}")
    return 1 if failed else 0


def echo_consoles(guests):
    sent = {g.name: 0 for g in guests}
    while True:
        for g in guests:
            lines = g.lines()
            for l in lines[sent[g.name]:]:
                print(f"[{g.name}] {l}", flush=True)
            sent[g.name] = len(lines)
        time.sleep(0.2)


def preflight():
    if os.geteuid() != 0:
        unavailable("it needs root (network namespace, taps, bridge)")
    if not os.path.exists("/dev/net/tun"):
        unavailable("/dev/net/tun is missing (the guests' taps need it)")
    for tool in ("qemu-system-x86_64", "dumpcap", "tshark", "ip", "apt-get", "dpkg-deb", "readelf", "modinfo"):
        if not shutil.which(tool):
            unavailable(f"{tool} is missing (scripts/test installs qemu-system-x86 tshark iproute2 binutils kmod)")


def outside(mode, names):
    preflight()
    lib = Path(os.environ.get("UROCE_INTEROP_LIB", REPO / "target/release/liburoce_ffi.so"))
    uroce = Path(os.environ.get("UROCE_INTEROP_UROCE", REPO / "target/release/uroce"))
    for f in (lib, uroce):
        if not f.exists():
            die(f"{f} is missing: cargo build --release -p uroce-ffi -p uroce-cli")
    vmlinux, initrd, _ = build_image()  # outside: apt-get needs the host's network
    ns = f"uroce-interop-{os.getpid()}"
    old_runs = sorted((WORK / "runs").glob("*")) if (WORK / "runs").exists() else []
    for old in old_runs[:-KEEP_RUNS]:  # the cache keeps the last few runs' captures and logs
        shutil.rmtree(old, ignore_errors=True)
    rundir = WORK / "runs" / time.strftime("%Y%m%d-%H%M%S")
    libdir = rundir / "lib"
    libdir.mkdir(parents=True)
    shutil.copy(lib, libdir / "libibverbs.so.1")
    cm_lib = lib.with_name("liburoce_ffi_rdmacm.so")  # uroce's librdmacm.so.1 (forwarders)
    if cm_lib.exists():
        shutil.copy(cm_lib, libdir / "librdmacm.so.1")
    t0 = time.monotonic()
    try:
        try:
            subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, text=True)
            for cmd in (["ip", "link", "set", "lo", "up"],
                        ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"],
                        ["ip", "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"],
                        ["ip", "addr", "add", f"{HOST_IP}/24", "dev", "br0"],
                        ["ip", "link", "set", "br0", "up"]):
                subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as e:
            unavailable(f"cannot set up a network namespace with a bridge: {' '.join(e.cmd)}: {e.stderr.strip()}")
        log(f"namespace {ns}, bridge br0 {HOST_IP}/24, library {lib}")
        r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, __file__, "_inside", mode, str(rundir),
                            str(libdir / "libibverbs.so.1"), str(uroce), str(vmlinux), str(initrd), *names])
        rc = r.returncode
    finally:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:  # only ours can be there: the namespace is private to this run
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    log(f"{mode} finished in {time.monotonic() - t0:.1f} s wall (rc {rc})")
    return rc


# What `record` keeps: rxe to rxe for every kind of traffic the guests can make, rxe to
# uroce for the RC operations (both ways). Files are cut to their first packets (the
# bandwidth tests' full-MTU packets to fewer) so that the fixtures stay small.
FIXTURES_RXE = ["rc_pingpong_1", "rc_pingpong", "srq_pingpong", "send_lat", "write_bw", "read_bw", "atomic_bw",
                "atomic_cs_bw", "uc_pingpong", "ud_pingpong", "rping", "ucmatose", "udaddy"]
FIXTURES_UROCE = ["rc_pingpong", "write_bw", "read_bw", "atomic_bw", "atomic_cs_bw"]


def cut(pcap, out):
    """The first 300 packets of a capture of small packets, the first 100 otherwise."""
    size, count = pcap.stat().st_size, int(sh("capinfos", "-M", "-c", "-r", str(pcap)).split()[-1])
    keep = 300 if size < 200 * max(count, 1) else 100
    subprocess.run(["editcap", "-r", str(pcap), str(out), f"1-{keep}"], check=True)
    out.chmod(0o644)


def record(dest):
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    rc = 0
    for mode, names, tag in (("guests", FIXTURES_RXE, "rxe-rxe"), ("run", FIXTURES_UROCE, "rxe-uroce")):
        runs = WORK / "runs"
        before = set(runs.glob("*")) if runs.exists() else set()
        rc |= outside(mode, names)
        (run,) = set(runs.glob("*")) - before
        for pcap in sorted(run.glob("*.pcap")):
            m = re.match(r"\d+-(.*)-(uroce|rxe)-server\.pcap$", pcap.name)
            out = dest / (f"{tag}-{m.group(1)}.pcap" if mode == "guests" else
                          f"{tag}-{m.group(1)}-{m.group(2)}-server.pcap")
            cut(pcap, out)
    manifest = sorted(WORK.glob("image-*/manifest.txt"), key=lambda p: p.stat().st_mtime)[-1]
    shutil.copy(manifest, dest / "manifest.txt")
    (dest / "manifest.txt").chmod(0o644)
    return rc


def main():
    argv = sys.argv[1:]
    if argv[:1] == ["_inside"]:
        sys.exit(inside(argv[1:]))
    cmd = argv[0] if argv else "run"
    names = argv[1:]
    for n in names if cmd in ("run", "guests") else []:
        if n not in BY_NAME:
            die(f"unknown scenario {n} (interop.py list)")
    if cmd == "list":
        for s in SCENARIOS:
            print(f"{s.name:18} {'both ways with uroce' if s.uroce else 'rxe to rxe only'}: {s.server}")
    elif cmd == "build":
        preflight()
        print(build_image()[1])
    elif cmd == "run":
        sys.exit(outside("run", names or [s.name for s in SCENARIOS if s.uroce]))
    elif cmd == "guests":
        sys.exit(outside("guests", names or [s.name for s in SCENARIOS]))
    elif cmd == "record" and len(names) == 1:
        sys.exit(record(names[0]))
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
