"""Processes on the guest: whether a recorded one still runs (pid, boot, start time and
folder, so a reused pid, a reboot or a copied home never counts), group kills, ports, and
how well the machine is doing."""

import os
import signal
import socket
import time


def stat_fields(pid):
    """The fields of /proc/PID/stat after the command name, from field 3 (state) on; the
    name is skipped by its last ')' since it may hold spaces and parentheses. Raises OSError
    when the process is gone, ValueError when the file is not what Linux writes."""
    with open("/proc/%d/stat" % int(pid), "rb") as f:
        stat = f.read().decode("ascii", "replace")
    return stat[stat.rindex(")") + 2:].split(" ")


def pid_alive(pid):
    """True when pid names a live (not zombie) process."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        return stat_fields(pid)[0] not in ("Z", "X")
    except (OSError, ValueError):
        return True


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def proc_start(pid):
    """The process's start time in clock ticks since boot (field 22 of /proc/pid/stat)."""
    try:
        return int(stat_fields(pid)[19])
    except (OSError, ValueError, IndexError):
        return None


def proc_cwd(pid):
    try:
        return os.readlink("/proc/%d/cwd" % pid)
    except OSError:
        return None


def identity(pid, cwd):
    """What tells this process apart from a later one that reuses its pid, a reboot, or the
    same files copied to another home (a fork that copies disks but not processes)."""
    return {"pid": pid, "boot": boot_id(), "start": proc_start(pid), "cwd": os.path.realpath(cwd)}


def owned_alive(ident, cwd):
    """True when the process recorded as ident (pid/boot/start) still runs, in folder cwd."""
    if not isinstance(ident, dict) or not pid_alive(ident.get("pid")):
        return False
    if ident.get("boot") and ident["boot"] != boot_id():
        return False
    if ident.get("start") is not None and proc_start(ident["pid"]) not in (None, ident["start"]):
        return False
    actual = proc_cwd(ident["pid"])
    if actual is not None and actual != os.path.realpath(cwd):
        return False
    return True


def proc_cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def servers_in(tree):
    """Session leaders running `opencode serve` the way the helper starts it, in `tree`: a
    server whose record went with the helper's state, which nothing would stop otherwise
    (a second server on the same sessions could go on writing one while it is exported)."""
    found, real = [], os.path.realpath(tree)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            leader = os.getsid(pid) == pid
        except OSError:
            continue
        if leader and proc_cwd(pid) == real and " serve --hostname 127.0.0.1 --port " in proc_cmdline(pid):
            found.append(pid)
    return found


def kill_group(pid, grace=3.0):
    """SIGTERM the process group led by pid (falling back to the pid), then SIGKILL."""
    if not pid_alive(pid):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except OSError:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if sig == signal.SIGTERM:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.05)


def session_cpu(sid):
    """CPU ticks used so far by the processes of session sid (the server runs in its own),
    including children that already exited; None when /proc cannot be read. A server that
    does not answer while this grows is busy (its event loop blocked by work, or waiting on a
    child such as git), not hung."""
    total, found = 0, False
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        try:
            fields = stat_fields(name)
            if int(fields[3]) != sid:
                continue
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
            found = True
        except (OSError, ValueError, IndexError):
            continue
    return total if found else None


def port_listening(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine_health():
    """(short_of_memory, overloaded, description) from /proc: MemAvailable below 10 % of
    MemTotal; 1-minute load above 4x the CPUs. BOXD_HELPER_MACHINE=well|short-of-memory|overloaded
    replaces the measurement (tests use it so a busy test machine cannot change their results)."""
    forced = os.environ.get("BOXD_HELPER_MACHINE")
    if forced == "well":
        return False, False, ""
    if forced == "short-of-memory":
        return True, False, "short of memory (BOXD_HELPER_MACHINE)"
    if forced == "overloaded":
        return False, True, "overloaded (BOXD_HELPER_MACHINE)"
    mem = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                mem[k] = int(v.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/proc/loadavg") as f:
            load1 = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        load1 = 0.0
    cpus = os.cpu_count() or 1
    total, avail = mem.get("MemTotal", 0), mem.get("MemAvailable", 0)
    short, over = bool(total and avail < total * 0.10), load1 > 4 * cpus
    reasons = []
    if short:
        reasons.append("short of memory (%d MiB available of %d MiB)" % (avail // 1024, total // 1024))
    if over:
        reasons.append("overloaded (1-minute load %.1f on %d CPUs)" % (load1, cpus))
    return short, over, " and ".join(reasons)


def largest_processes(n=3):
    procs = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/status" % name) as f:
                info = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
            rss_kb = int(info.get("VmRSS", "0 kB").split()[0])
        except (OSError, ValueError):
            continue
        cmd = proc_cmdline(int(name)).strip() or info.get("Name", "?")
        procs.append((rss_kb, int(name), cmd[:80]))
    procs.sort(reverse=True)
    return ["%s (pid %d, %d MiB)" % (cmd, pid, rss // 1024) for rss, pid, cmd in procs[:n]]
