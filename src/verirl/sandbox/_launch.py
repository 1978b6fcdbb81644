"""The sandbox's launcher: run as a script (``python -I -S _launch.py CONFIG_JSON``), standard library
only, so that it starts fast and imports nothing from the trainer's environment.

It enters new namespaces (user where it is not root, then mount, PID, network, IPC, UTS), forks the
sandbox's first process (PID 1 of its PID namespace: when it ends, the kernel kills every process
inside), and waits for it; its exit status is the sandbox's. The launcher stays outside the
sandbox, where nothing inside can reach it, and it is the one that ends the sandbox: SIGTERM (sent
by the caller at a deadline, or by the kernel when the caller dies: its parent-death signal) makes
it SIGKILL the first process, and so the whole PID namespace.

The first process leaves the caller's session (no terminal to type into), makes the file system
read-only but for fresh tmpfs mounts on /tmp (its working directory) and /dev/shm, replaces /dev
with null, zero, full, random and urandom alone, hides the paths it is told to (and /run, where
the machine's sockets live), mounts a /proc that shows only the sandbox's processes, sets the
resource limits, drops to an unprivileged uid of its own (as root) or drops every capability (in a
user namespace), and then either executes the program (``mode: program``) or runs a function of
verirl's (``mode: worker``: the reward pool's worker, after it has imported its rules). If it
cannot drop its privileges it stops (exit 125) rather than run anything.

Every step that the kernel refuses is recorded, not fatal: the first process writes what it set up
as one JSON line to ``report_fd`` (or hands it to the worker function) and goes on with the rest.
"""
from __future__ import annotations

import ctypes
import errno
import importlib
import json
import os
import resource
import select
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x2000, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 4, 38, 36
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, AT_RECURSIVE, AT_FDCWD = 0x1, 0x2, 0x8000, -100
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (the unified syscall table)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _check(result: int, what: str) -> None:
    if result != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0), "prctl")


def _mount(source, target, fstype, flags: int, data=None) -> None:
    enc = [x.encode() if isinstance(x, str) else x for x in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], flags, enc[3]), f"mount {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _unshare(report: dict) -> None:
    """New namespaces: all at once where the kernel allows it, else each that it allows."""
    root = os.geteuid() == 0
    uid, gid = os.geteuid(), os.getegid()
    wanted = [("mount", CLONE_NEWNS), ("pid", CLONE_NEWPID), ("network", CLONE_NEWNET), ("ipc", CLONE_NEWIPC),
              ("uts", CLONE_NEWUTS)]
    if not root:
        try:
            _check(_libc.unshare(CLONE_NEWUSER), "unshare(user)")
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
            report["user namespace"] = "on"
        except OSError as e:
            report["user namespace"] = f"off ({e.strerror or e})"
    flags = sum(f for _, f in wanted)
    if _libc.unshare(flags) == 0:
        report.update({f"{name} namespace": "on" for name, _ in wanted})
        return
    for name, flag in wanted:
        ok = _libc.unshare(flag) == 0
        report[f"{name} namespace"] = "on" if ok else f"off ({os.strerror(ctypes.get_errno())})"


def _read_only_root(report: dict) -> None:
    attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    res = _libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr))
    if res == 0:
        report["read-only file system"] = "on"
        return
    failed = []  # an older kernel: each mount of the tree in turn
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for point in points:
        try:
            _mount(None, point.encode().decode("unicode_escape"), None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)
        except OSError:
            failed.append(point)
    report["read-only file system"] = "on" if not failed else f"partly ({len(failed)} mounts stay writable)"


def _under(path: str, top: str) -> bool:
    return path.startswith(top.rstrip("/") + "/")


def _hide(hide: dict[str, bool], keep: list[str]) -> None:
    """Cover each path of ``hide`` with an empty read-only tmpfs (a file: /dev/null). The directories
    of ``keep`` inside one (the interpreter and its packages) are bound back at their own path,
    read-only, so that the program still finds them (and a uid that cannot pass a private home can
    reach them); a hidden path inside a kept directory is covered after it is bound back."""
    outer = {h: d for h, d in hide.items() if not any(_under(h, o) for o in hide) and not any(_under(h, k) for k in keep)}
    inner = {h: d for h, d in hide.items() if h not in outer and not any(_under(h, o) for o in outer)}
    staged: list[tuple[str, str]] = []
    os.makedirs("/tmp/.verirl-keep", exist_ok=True)
    for i, k in enumerate(keep):
        if any(_under(k, h) for h in outer) and os.path.isdir(k):
            stage = f"/tmp/.verirl-keep/{i}"
            os.mkdir(stage)
            _mount(k, stage, None, MS_BIND | MS_REC)
            staged.append((stage, k))
    _cover(outer)
    for stage, k in staged:
        os.makedirs(k, mode=0o755, exist_ok=True)
        _mount(stage, k, None, MS_MOVE)
        os.rmdir(stage)
    os.rmdir("/tmp/.verirl-keep")
    _cover({h: d for h, d in inner.items() if os.path.lexists(h)})
    _read_only(outer)


def _cover(paths: dict[str, bool]) -> None:
    for h, is_dir in paths.items():
        if is_dir:
            _mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
        else:
            _mount("/dev/null", h, None, MS_BIND)


def _read_only(paths: dict[str, bool], recursive: bool = True) -> None:
    attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    for h, is_dir in paths.items():
        if is_dir:
            _check(_libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, h.encode(), AT_RECURSIVE if recursive else 0,
                                 ctypes.byref(attr), ctypes.sizeof(attr)), f"read-only {h}")


DEVICES = ("null", "zero", "full", "random", "urandom")


def _minimal_dev(size: str) -> None:
    """/dev with the five harmless devices alone (no terminal, no GPU, no disk), and a private /dev/shm."""
    os.mkdir("/tmp/.verirl-dev")
    for name in DEVICES:
        open(f"/tmp/.verirl-dev/{name}", "w").close()
        _mount(f"/dev/{name}", f"/tmp/.verirl-dev/{name}", None, MS_BIND)
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for name in DEVICES:
        open(f"/dev/{name}", "w").close()
        _mount(f"/tmp/.verirl-dev/{name}", f"/dev/{name}", None, MS_MOVE)
        os.unlink(f"/tmp/.verirl-dev/{name}")
    os.rmdir("/tmp/.verirl-dev")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"/dev/{name}")
    os.mkdir("/dev/shm")
    _read_only({"/dev": True}, recursive=False)
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, size)


def _mounts(cfg: dict, report: dict) -> None:
    names = ["read-only file system", "private /tmp", "private /dev", "hidden paths", "private /proc"]
    if report.get("mount namespace") != "on":
        report.update({n: "off (no mount namespace)" for n in names})
        return
    try:
        _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the caller's mounts
    except OSError as e:
        report.update({n: f"off (mounts are not private: {e.strerror})" for n in names})
        return
    try:
        _read_only_root(report)
    except OSError as e:
        report["read-only file system"] = f"off ({e.strerror})"
    size = f"size={int(cfg['limits']['tmp_mb'])}m,mode=1777"
    try:
        _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, size)
        report["private /tmp"] = "on"
    except OSError as e:
        report["private /tmp"] = f"off ({e.strerror})"
        report["private /dev"] = report["hidden paths"] = "off (no private /tmp to stage them in)"
    if report["private /tmp"] == "on":
        try:
            _minimal_dev(size)
            report["private /dev"] = "on"
        except OSError as e:
            report["private /dev"] = f"off ({e})"
        hide = {h: d for h, d in cfg["_hide"].items() if os.path.lexists(h)}  # not under the new /tmp
        try:
            _hide(hide, list(dict.fromkeys(cfg.get("keep", []))))
            report["hidden paths"] = f"on ({len(hide)}: {', '.join(hide)})" if hide else "on (none asked)"
        except OSError as e:
            report["hidden paths"] = f"off ({e})"
    if report.get("pid namespace") == "on":
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            report["private /proc"] = "on"
        except OSError as e:
            report["private /proc"] = f"off ({e.strerror})"
    else:
        report["private /proc"] = "off (no pid namespace)"


def _limits(cfg: dict, report: dict) -> None:
    lim, refused = cfg["limits"], []
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the file size limit a write fails (EFBIG), not the process
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core files of what runs inside
    for name, key, scale in [("RLIMIT_NOFILE", "files", 1), ("RLIMIT_FSIZE", "file_mb", 2**20),
                             ("RLIMIT_NPROC", "processes", 1), ("RLIMIT_AS", "memory_mb", 2**20),
                             ("RLIMIT_CPU", "cpu_s", 1)]:
        value = lim.get(key) or 0
        if value <= 0:
            continue
        which = getattr(resource, name)
        cap = int(value * scale)
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        try:
            resource.setrlimit(which, (cap, cap))
        except (ValueError, OSError):
            refused.append(key)
    report["limits"] = f"partly (refused: {', '.join(refused)})" if refused else "on"


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


def _capabilities_left() -> bool:
    """Whether this process holds any capability (in its own user namespace)."""
    with open("/proc/self/status") as f:
        caps = {k: int(v, 16) for k, v in (line.split(":\t") for line in f if line.startswith("Cap"))}
    return bool(caps.get("CapEff") or caps.get("CapPrm"))


def _drop_privileges(cfg: dict, report: dict, in_userns: bool) -> None:
    """As root: the sandbox's own uid and gid, no groups (which clears every capability). Otherwise:
    every capability dropped (`capset`). Either way ``no_new_privs``. A failure stops the sandbox."""
    if os.geteuid() == 0 and not in_userns:
        os.setgroups([])
        os.setgid(cfg["gid"])
        os.setuid(cfg["uid"])
        if os.getuid() != cfg["uid"] or os.geteuid() != cfg["uid"]:
            raise OSError(errno.EPERM, "the uid did not change")
        report["unprivileged uid"] = f"on (uid {cfg['uid']})"
    else:
        data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable} sets, all zero
        _check(_libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data), "capset")
        report["unprivileged uid"] = f"on (uid {os.getuid()}, no capabilities)"
    if _capabilities_left():
        raise OSError(errno.EPERM, "capabilities are left after dropping them")
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    _prctl(PR_SET_DUMPABLE, 1)  # a change of uid clears it, and with it the process's own /proc files


def _parent_gone(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])  # its write end closed: readable at end-of-file


def _die_with(parent_fd: int) -> None:
    try:
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    except OSError:
        pass
    if _parent_gone(parent_fd):
        os._exit(1)


def _prepare(cfg: dict):
    """A worker's function and what it prepared (its imports), before the namespaces: the files they
    come from may be ones the sandbox cannot read."""
    if cfg["mode"] != "worker":
        return None, None
    sys.path[:] = cfg["sys_path"]
    module, _, name = cfg["entry"].partition(":")
    entry = getattr(importlib.import_module(module), name)
    return entry, entry(cfg["args"], None, prepare=True)


def _first_process(cfg: dict, report: dict, parent_fd: int, entry, prepared) -> None:
    os.setsid()  # out of the caller's session: no controlling terminal to push keystrokes into
    _die_with(parent_fd)
    try:
        _write("/proc/self/oom_score_adj", "1000")  # the kernel's out-of-memory killer takes the sandbox first
    except OSError:
        pass
    in_userns = report.get("user namespace") == "on"
    _mounts(cfg, report)
    os.chdir("/tmp" if report.get("private /tmp") == "on" else cfg["_workdir"])
    if cfg["mode"] == "program":
        with open("main.py", "w") as f:
            f.write(cfg["code"])
        os.chmod("main.py", 0o644)
    _limits(cfg, report)
    _drop_privileges(cfg, report, in_userns)
    _die_with(parent_fd)  # a change of uid clears the parent-death signal
    os.environ.clear()
    os.environ.update(cfg["env"])
    if cfg["mode"] == "worker":
        os.close(parent_fd)
        entry(cfg["args"], report, prepare=False, prepared=prepared)
        os._exit(0)
    if cfg.get("report_fd") is not None:
        os.write(cfg["report_fd"], (json.dumps(report) + "\n").encode())
        os.close(cfg["report_fd"])
    os.close(parent_fd)
    os.execve(cfg["argv"][0], [*cfg["argv"], "main.py"], cfg["env"])


def _descendants(pid: int) -> list[int]:
    found = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        pass
    return found


def _reap_all() -> None:
    """Without a PID namespace: kill and reap what the sandbox left (this process is their subreaper)."""
    for _ in range(100):
        kids = _descendants(os.getpid())
        if not kids:
            break
        for kid in kids:
            try:
                os.kill(kid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


_child = 0


def _stop(signum, frame) -> None:
    """SIGTERM (the caller's deadline, or its death): end the sandbox from outside it."""
    if _child:
        try:
            os.kill(_child, signal.SIGKILL)
        except ProcessLookupError:  # already gone (the pool kills the tree first): nothing to stop
            pass
    else:
        os._exit(128 + signum)


def main() -> None:
    global _child
    cfg = json.loads(sys.argv[1])
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the caller decides
    _prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))  # the caller's death ends the sandbox through `_stop`
    if os.getppid() != cfg["parent_pid"]:
        os._exit(1)  # the caller is gone already
    entry, prepared = _prepare(cfg)
    cfg["_hide"] = {h: os.path.isdir(h) for h in cfg.get("hide", []) if os.path.lexists(h)}
    report: dict = {}
    _unshare(report)
    workdir = None
    if report.get("mount namespace") != "on":  # the real file system: a directory of this sandbox's own
        import tempfile
        workdir = tempfile.mkdtemp(prefix="verirl-sandbox-")
        if os.geteuid() == 0:
            os.chown(workdir, cfg["uid"], cfg["gid"])
    cfg["_workdir"] = workdir
    if report.get("pid namespace") != "on":
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    alive_r, alive_w = os.pipe()
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.close(alive_w)
        try:
            _first_process(cfg, report, alive_r, entry, prepared)
        except BaseException as e:  # noqa: BLE001  (the set-up failed: say why on stderr, exit 125)
            print(f"verirl sandbox: set-up failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            os._exit(125)
        os._exit(0)
    _child = child
    os.close(alive_r)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    if report.get("pid namespace") != "on":
        _reap_all()
    if workdir:
        import shutil
        shutil.rmtree(workdir, ignore_errors=True)
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    try:
        main()
    except OSError as e:
        if e.errno != errno.EINTR:
            raise
