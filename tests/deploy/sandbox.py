"""Run a command under the exec-time hardening a systemd unit asks for, without systemd.

    python tests/deploy/sandbox.py --unit UNIT --writable DIR... -- COMMAND...

What it applies, read from the unit's [Service] section (each as systemd 252 does it):
  * ProtectSystem=strict: a private mount namespace in which every mount except /proc,
    /sys, /dev and the --writable directories (RuntimeDirectory=, StateDirectory=,
    ReadWritePaths= after the test's path substitution) is remounted read-only;
  * UMask=; CapabilityBoundingSet= (empty: every capability dropped from the bounding set,
    so even root holds none after execve); AmbientCapabilities=; NoNewPrivileges=;
  * SystemCallFilter= (allow-list: @default, then each line in order, groups expanded by
    `systemd-analyze syscall-filter`; anything else fails with SystemCallErrorNumber=
    when the unit sets it, else kills the process, as systemd does) and
    SystemCallArchitectures=native;
  * RestrictAddressFamilies= (socket() with another family fails with EAFNOSUPPORT);
  * LockPersonality= (personality() changes fail with EPERM);
  * MemoryDenyWriteExecute=: systemd 252's seccomp rules (no W+X mmap, no mprotect or
    pkey_mprotect to PROT_EXEC, no shmat with SHM_EXEC) and the kernel's PR_SET_MDWE
    (which systemd 255+ prefers).
Not applied, and why: User=/Group= (the interpreter under test lives in root's home),
ProtectHome= and PrivateTmp= (the test's files live under /root and /tmp; the read-only
root makes /tmp stricter here than PrivateTmp's writable private copy), and the namespace
settings for /proc, the kernel and devices, which the gateway does not touch.

Before exec it prints one JSON line to stderr, {"sandbox": [applied settings]}, so the
test can tell that each one was in force. Standard library only (libc and libseccomp via
ctypes): it runs before the command's interpreter exists.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from unitfile import read_unit  # noqa: E402

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
_KEEP = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}

PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_SET_MDWE = 24, 38, 47, 65
PR_CAP_AMBIENT_CLEAR_ALL, PR_MDWE_REFUSE_EXEC_GAIN = 4, 1
PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000
PER_LINUX = 0

SCMP_ACT_KILL_PROCESS, SCMP_ACT_ALLOW = 0x80000000, 0x7FFF0000
SCMP_CMP_NE, SCMP_CMP_GT, SCMP_CMP_EQ, SCMP_CMP_MASKED_EQ = 1, 6, 4, 7
AF_BY_NAME = {
    "AF_UNIX": socket.AF_UNIX,
    "AF_INET": socket.AF_INET,
    "AF_INET6": socket.AF_INET6,
    "AF_NETLINK": 16,
    "AF_PACKET": 17,
}
AF_MAX = 46  # families above every one the kernel knows are refused by one GT rule


def scmp_act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class SandboxError(RuntimeError):
    pass


def _check(rc: int, what: str) -> None:
    if rc < 0 or (rc == -1):
        code = ctypes.get_errno() or -rc
        raise SandboxError(f"{what}: {os.strerror(code)}")


# --- ProtectSystem=strict ----------------------------------------------------------------


def _unescape(path: str) -> str:
    return path.encode().decode("unicode_escape").encode("latin-1").decode()


def protect_system_strict(writable: list[Path]) -> None:
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    keep = [p.resolve() for p in writable]
    for path in keep:
        _check(libc.mount(str(path).encode(), str(path).encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
    api = [Path("/proc"), Path("/sys"), Path("/dev")]
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mounts.append((Path(_unescape(fields[4])), fields[5]))
    for point, options in sorted(mounts, key=lambda m: len(m[0].parts)):
        if any(point == a or a in point.parents for a in api):
            continue
        if any(point == w or w in point.parents for w in keep):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for option in options.split(","):
            flags |= _KEEP.get(option, 0)
        _check(libc.mount(None, str(point).encode(), None, flags, None), f"remount {point} read-only")


# --- capabilities, no_new_privs, MDWE -----------------------------------------------------


def drop_capabilities() -> None:
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        _check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")


def no_new_privileges() -> None:
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")


def kernel_mdwe() -> None:
    _check(libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0), "PR_SET_MDWE")


# --- seccomp -------------------------------------------------------------------------------


def syscall_groups() -> dict[str, list[str]]:
    out = subprocess.run(["systemd-analyze", "syscall-filter"], check=True, capture_output=True, text=True).stdout
    groups: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in out.splitlines():
        if not line.strip():
            current = None
            continue
        if not line.startswith(" ") and line.startswith("@"):
            current = groups.setdefault(line.strip(), [])
            continue
        item = line.strip()
        if current is not None and not item.startswith("#"):
            current.append(item)
    return groups


def expand(names: list[str], groups: dict[str, list[str]]) -> set[str]:
    out: set[str] = set()
    for name in names:
        if name.startswith("@"):
            if name not in groups:
                raise SandboxError(f"unknown system call group {name}")
            out |= expand(groups[name], groups)
        else:
            out.add(name.split(":", 1)[0])
    return out


def allowed_syscalls(lines: list[str], groups: dict[str, list[str]]) -> set[str]:
    lines = [line for line in lines if line]
    if not lines or lines[0].startswith("~"):
        raise SandboxError("only allow-list SystemCallFilter= is emulated")
    allowed = expand(["@default"], groups)
    for line in lines:
        if line.startswith("~"):
            allowed -= expand(line[1:].split(), groups)
        else:
            allowed |= expand(line.split(), groups)
    return allowed


class Seccomp:
    def __init__(self) -> None:
        path = ctypes.util.find_library("seccomp")
        if path is None:
            raise SandboxError("libseccomp is not installed")
        self.lib = ctypes.CDLL(path, use_errno=True)
        self.lib.seccomp_init.restype = ctypes.c_void_p
        self.lib.seccomp_init.argtypes = [ctypes.c_uint32]
        self.lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        self.lib.seccomp_rule_add_array.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.POINTER(ArgCmp),
        ]
        self.lib.seccomp_load.argtypes = [ctypes.c_void_p]
        self.lib.seccomp_release.argtypes = [ctypes.c_void_p]

    def number(self, name: str) -> int | None:
        nr = self.lib.seccomp_syscall_resolve_name(name.encode())
        return None if nr < 0 else nr

    def filter(self, default: int) -> int:
        ctx = self.lib.seccomp_init(default)
        if not ctx:
            raise SandboxError("seccomp_init failed")
        return ctx

    def rule(self, ctx: int, action: int, name: str, *cmps: tuple[int, int, int, int]) -> bool:
        nr = self.number(name)
        if nr is None:
            return False  # not a system call on this architecture
        array = (ArgCmp * max(len(cmps), 1))(*[ArgCmp(*c) for c in cmps])
        rc = self.lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), array)
        if rc < 0:
            raise SandboxError(f"seccomp rule for {name}: {os.strerror(-rc)}")
        return True

    def load(self, ctx: int) -> None:
        rc = self.lib.seccomp_load(ctx)
        self.lib.seccomp_release(ctx)
        if rc < 0:
            raise SandboxError(f"seccomp_load: {os.strerror(-rc)}")


def build_filters(service: dict[str, list[str]], applied: list[str]) -> list[tuple[Seccomp, int]]:
    sc = Seccomp()
    filters = []
    if service.get("SystemCallFilter"):
        allow = allowed_syscalls(service["SystemCallFilter"], syscall_groups())
        error = service.get("SystemCallErrorNumber", [""])[-1]
        if error:
            # A filtered call fails with this errno instead of killing the process.
            if not hasattr(errno, error):
                raise SandboxError(f"unknown SystemCallErrorNumber={error}")
            default = scmp_act_errno(getattr(errno, error))
            applied.append(f"SystemCallErrorNumber={error}")
        else:
            default = SCMP_ACT_KILL_PROCESS
        ctx = sc.filter(default)  # native architecture only: others get the default action
        count = sum(sc.rule(ctx, SCMP_ACT_ALLOW, name) for name in sorted(allow))
        filters.append((sc, ctx))
        applied.append(f"SystemCallFilter({count} system calls)")
        if service.get("SystemCallArchitectures", [""])[-1] == "native":
            applied.append("SystemCallArchitectures=native")
    # The argument checks go in a second, default-allow filter; the kernel applies every
    # loaded filter and the most restrictive answer wins.
    ctx = sc.filter(SCMP_ACT_ALLOW)
    families = service.get("RestrictAddressFamilies", [""])[-1].split()
    if families:
        allowed = {AF_BY_NAME[name] for name in families}
        for family in range(AF_MAX + 1):
            if family not in allowed:
                sc.rule(ctx, scmp_act_errno(errno.EAFNOSUPPORT), "socket", (0, SCMP_CMP_EQ, family, 0))
        sc.rule(ctx, scmp_act_errno(errno.EAFNOSUPPORT), "socket", (0, SCMP_CMP_GT, AF_MAX, 0))
        applied.append("RestrictAddressFamilies=" + " ".join(families))
    if service.get("LockPersonality", [""])[-1] == "yes":
        sc.rule(ctx, scmp_act_errno(errno.EPERM), "personality", (0, SCMP_CMP_NE, PER_LINUX, 0))
        applied.append("LockPersonality=yes")
    if service.get("MemoryDenyWriteExecute", [""])[-1] == "yes":
        eperm = scmp_act_errno(errno.EPERM)
        sc.rule(ctx, eperm, "mmap", (2, SCMP_CMP_MASKED_EQ, PROT_EXEC | PROT_WRITE, PROT_EXEC | PROT_WRITE))
        sc.rule(ctx, eperm, "mprotect", (2, SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC))
        sc.rule(ctx, eperm, "pkey_mprotect", (2, SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC))
        sc.rule(ctx, eperm, "shmat", (2, SCMP_CMP_MASKED_EQ, SHM_EXEC, SHM_EXEC))
        applied.append("MemoryDenyWriteExecute=yes(seccomp)")
    filters.append((sc, ctx))
    return filters


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--unit", required=True, type=Path)
    parser.add_argument("--writable", action="append", type=Path, default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    service = read_unit(args.unit)["Service"]
    applied: list[str] = []
    try:
        if service.get("ProtectSystem", [""])[-1] == "strict":
            protect_system_strict(args.writable)
            applied.append("ProtectSystem=strict")
        umask = service.get("UMask", [""])[-1]
        if umask:
            os.umask(int(umask, 8))
            applied.append(f"UMask={umask}")
        filters = build_filters(service, applied)  # built while the files it reads are reachable
        if service.get("CapabilityBoundingSet") == [""]:
            drop_capabilities()
            applied.append("CapabilityBoundingSet=")
        if service.get("NoNewPrivileges", [""])[-1] == "yes":
            no_new_privileges()
            applied.append("NoNewPrivileges=yes")
        if service.get("MemoryDenyWriteExecute", [""])[-1] == "yes":
            kernel_mdwe()
            applied.append("MemoryDenyWriteExecute=yes(PR_SET_MDWE)")
        print(json.dumps({"sandbox": applied}), file=sys.stderr, flush=True)
        for sc, ctx in reversed(filters):  # the allow-list last: it does not allow seccomp()
            sc.load(ctx)
    except SandboxError as exc:
        print(json.dumps({"sandbox_error": str(exc)}), file=sys.stderr, flush=True)
        return 3
    os.execv(command[0], command)
    return 127


if __name__ == "__main__":
    sys.exit(main())
