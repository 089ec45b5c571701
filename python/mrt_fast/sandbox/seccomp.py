"""The seccomp filter of the sandbox, compiled by libseccomp (ctypes, no Python dependency).

Defence in depth on top of the namespaces: system calls that widen the kernel's
attack surface and that no judged program needs fail with ``EPERM``: nested user
namespaces (``clone``/``unshare`` with ``CLONE_NEWUSER``; ``clone3`` fails with
``ENOSYS`` so that libc falls back to ``clone``), ``ptrace`` and cross-process
memory access, keyrings, ``bpf``, ``perf_event_open``, ``userfaultfd``,
``io_uring``, mounts, module loading, ``kexec``, ``reboot``, ``swapon``,
``acct``, ``quotactl``, ``syslog`` and ``setns``; sockets of every family
(``socket``, ``socketpair``: a judged program reads stdin and writes stdout, and
data queued in socket buffers is kernel memory that ``RLIMIT_AS`` does not count
and, for ``AF_UNIX``, that a file descriptor sent in flight keeps out of
``RLIMIT_NOFILE`` too); and, for a run that has no memory
cgroup, the shared memory that ``RLIMIT_AS`` does not count (``memfd_create``,
``memfd_secret``, ``shmget``, ``shmat``, ``shmctl``). System calls of another
architecture (32-bit entry points) kill the caller (libseccomp's default).

`compile_filter` returns the classic BPF program for bubblewrap's ``--seccomp``,
or ``None`` where libseccomp is not installed (the sandbox then runs without it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os

DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "keyctl", "add_key", "request_key", "bpf",
    "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "mount", "umount2",
    "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "setns", "acct", "swapon", "swapoff", "reboot", "syslog", "quotactl", "name_to_handle_at",
    "open_by_handle_at", "lookup_dcookie",
)
# no judged program needs a socket (the network namespace has nothing to reach), and the data
# queued in socket buffers is kernel memory that RLIMIT_AS does not count
SOCKETS = ("socket", "socketpair")
# memory that RLIMIT_AS does not count: refused where no memory cgroup bounds it
SHARED_MEMORY = ("memfd_create", "memfd_secret", "shmget", "shmat", "shmctl")
CLONE_NEWUSER = 0x10000000
_ACT_ALLOW = 0x7FFF0000
_CMP_MASKED_EQ = 7


def _act_errno(e: int) -> int:
    return 0x00050000 | (e & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


@functools.lru_cache(maxsize=1)
def _lib():
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


@functools.lru_cache(maxsize=2)
def compile_filter(deny_shared_memory: bool = False) -> bytes | None:
    """The filter as bytes of ``struct sock_filter``, or ``None`` without libseccomp.

    ``deny_shared_memory``: also refuse `SHARED_MEMORY` (memfd and System V shared
    memory) with ``EPERM``, for runs whose memory no cgroup bounds.
    """
    lib = _lib()
    if lib is None:
        return None
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        return None
    try:
        def rule(action: int, name: str, *cmps: _ArgCmp) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:  # not a system call of this architecture
                return
            arr = (_ArgCmp * max(1, len(cmps)))(*cmps)
            rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr)
            if rc < 0:
                raise OSError(-rc, f"seccomp_rule_add({name}): {os.strerror(-rc)}")

        for name in DENIED + SOCKETS + (SHARED_MEMORY if deny_shared_memory else ()):
            rule(_act_errno(errno.EPERM), name)
        newuser = _ArgCmp(0, _CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
        rule(_act_errno(errno.EPERM), "clone", newuser)
        rule(_act_errno(errno.EPERM), "unshare", newuser)
        rule(_act_errno(errno.ENOSYS), "clone3")
        fd = os.memfd_create("seccomp", 0)
        try:
            rc = lib.seccomp_export_bpf(ctx, fd)
            if rc < 0:
                raise OSError(-rc, f"seccomp_export_bpf: {os.strerror(-rc)}")
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
