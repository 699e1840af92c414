//! Starting one child and knowing when it exited, without a thread per child.
//!
//! On Linux a child starts as posix_spawn starts one — `clone(CLONE_VM | CLONE_VFORK)`, the
//! host's memory shared until the child's `execve` — with two more steps before the exec:
//! PR_SET_PDEATHSIG(SIGKILL), so the child dies with the host, and a check that the host
//! is still its parent. std's `Command` can only add such a step with `pre_exec`, which
//! makes it fork: copying the page tables of a host holding a wasmtime store cost ~0.5 ms
//! a child (docs/performance.md). The clone also hands back a pidfd, which the run loop
//! polls beside the child's stderr: no reaper thread.
//!
//! Elsewhere (macOS), or on a kernel whose pidfds cannot be polled (before 5.3), std's
//! `Command` starts the child and a thread blocked in wait(2) reports its exit through a
//! pipe, polled the same way.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};

/// What the child is started with. Its stdout is a file of ours (see `outputs::StdoutFile`).
pub struct Start<'a> {
    pub binary: &'a Path,
    pub args: &'a [String],
    pub env: &'a [(String, String)],
    pub cwd: Option<&'a Path>,
    pub stdin_piped: bool,
    pub stdout: &'a File,
}

/// A started child, unreaped until `reap`: its pid (the leader of its own process group)
/// cannot be reused before, so killing the group never reaches a stranger. (With the
/// fallback's reaper thread it is reaped as it exits; the group may then outlive it.)
pub struct Child {
    pub pid: i32,
    pub stdin: Option<File>,
    pub stderr: File,
    exit: Exit,
    /// Its status, once known; `reaped` once waited for.
    status: Option<ExitStatus>,
    reaped: bool,
}

enum Exit {
    /// Readable once the child exited; the status read without reaping, then reaped.
    Pidfd(OwnedFd),
    /// A thread reaped it and writes its wait status here (closed unwritten if the wait
    /// failed).
    Reported(File),
}

impl Child {
    /// Listed as running (running.rs) until it is reaped.
    fn new(pid: i32, stdin: Option<File>, stderr: File, exit: Exit) -> Child {
        super::running::listed(pid);
        Child { pid, stdin, stderr, exit, status: None, reaped: false }
    }

    /// Readable (poll) once the child has exited.
    pub fn exit_fd(&self) -> RawFd {
        match &self.exit {
            Exit::Pidfd(fd) => fd.as_raw_fd(),
            Exit::Reported(f) => f.as_raw_fd(),
        }
    }

    /// The status of a child that has exited (`exit_fd` readable), leaving it unreaped
    /// where it can: the zombie keeps its pid and group id ours until `reap`.
    pub fn exit_status(&mut self) -> io::Result<ExitStatus> {
        if let Some(s) = self.status {
            return Ok(s);
        }
        let status = match &mut self.exit {
            Exit::Pidfd(_) => loop {
                // SAFETY: waitid on our own child into a local siginfo; WNOWAIT leaves it.
                let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
                let r = unsafe { libc::waitid(libc::P_PID, self.pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) };
                if r == 0 {
                    // SAFETY: waitid filled a SIGCHLD siginfo, whose si_status is set.
                    let st = unsafe { info.si_status() };
                    break match info.si_code {
                        libc::CLD_EXITED => (st & 0xff) << 8,
                        libc::CLD_DUMPED => st | 0x80,
                        _ => st,
                    };
                }
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            },
            Exit::Reported(f) => {
                let mut word = [0u8; 4];
                // The thread reaped it: its pid is no longer surely ours.
                super::running::unlisted(self.pid);
                f.read_exact(&mut word).map_err(|_| io::Error::other("the wait for it failed"))?;
                self.reaped = true;
                i32::from_ne_bytes(word)
            }
        };
        let status = ExitStatus::from_raw(status);
        self.status = Some(status);
        Ok(status)
    }

    /// Wait for the child (it may still run) and reap it, once; its status.
    pub fn reap(&mut self) -> io::Result<ExitStatus> {
        if self.reaped {
            return self.exit_status();
        }
        if matches!(self.exit, Exit::Reported(_)) {
            return self.exit_status();
        }
        // Unlisted first: once reaped, its pid may name someone else's process.
        super::running::unlisted(self.pid);
        loop {
            let mut status = 0;
            // SAFETY: waitpid on our own unreaped child, into a local.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r == self.pid {
                self.reaped = true;
                let st = ExitStatus::from_raw(status);
                self.status.get_or_insert(st);
                return Ok(st);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// A child dropped unreaped (a panic between its start and its end) is killed with its
/// group and reaped, not left to run unwatched.
impl Drop for Child {
    fn drop(&mut self) {
        if !self.reaped {
            super::kill_group(self.pid);
            let _ = self.reap();
        }
    }
}

/// A thread that waits for `pid` and writes its wait status into the returned pipe.
fn report_exit(pid: i32) -> io::Result<File> {
    let (read, mut write) = pipe()?;
    std::thread::spawn(move || loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child, into a local.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            let _ = write.write_all(&status.to_ne_bytes());
            return;
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return; // closed unwritten: the run fails with "the wait for it failed"
        }
    });
    Ok(read)
}

/// Start the child in a process group of its own, with only `env`, its stdin a pipe or
/// /dev/null, its stdout `stdout` and its stderr a pipe.
pub fn start(s: &Start<'_>) -> io::Result<Child> {
    #[cfg(target_os = "linux")]
    if linux::pollable_pidfds() {
        if let Some(started) = linux::start(s).transpose() {
            return started;
        }
    }
    start_with_command(s)
}

/// The fallback: std's `Command` (fork on Linux, for PR_SET_PDEATHSIG) and a reaper thread.
pub fn start_with_command(s: &Start<'_>) -> io::Result<Child> {
    let mut cmd = Command::new(s.binary);
    cmd.args(s.args).env_clear().envs(s.env.iter().map(|(k, v)| (k, v))).process_group(0);
    cmd.stdin(if s.stdin_piped { Stdio::piped() } else { Stdio::null() });
    cmd.stdout(Stdio::from(s.stdout.try_clone()?)).stderr(Stdio::piped());
    if let Some(cwd) = s.cwd {
        cmd.current_dir(cwd);
    }
    #[cfg(target_os = "linux")]
    die_with_host(&mut cmd);
    let mut child = cmd.spawn()?;
    let (stdin, stderr) = (child.stdin.take().map(owned_file), owned_file(child.stderr.take().expect("stderr is piped")));
    let pid = child.id() as i32;
    // std's Child is dropped unwaited (that neither kills nor reaps); the thread reaps it.
    Ok(Child::new(pid, stdin, stderr, Exit::Reported(report_exit(pid)?)))
}

fn owned_file(f: impl Into<OwnedFd>) -> File {
    File::from(f.into())
}

/// A close-on-exec pipe: (read end, write end).
pub(super) fn pipe() -> io::Result<(File, File)> {
    let mut fds = [0; 2];
    #[cfg(target_os = "linux")]
    // SAFETY: pipe2 fills the two-element array; each fd is then owned once.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    #[cfg(not(target_os = "linux"))]
    // SAFETY: as above; close-on-exec is set before any child is started from this thread.
    let r = unsafe {
        let r = libc::pipe(fds.as_mut_ptr());
        if r == 0 {
            libc::fcntl(fds[0], libc::F_SETFD, libc::FD_CLOEXEC);
            libc::fcntl(fds[1], libc::F_SETFD, libc::FD_CLOEXEC);
        }
        r
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nothing else.
    Ok(unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) })
}

/// With std's `Command` (the fallback): the child gets SIGKILL when the host dies.
#[cfg(target_os = "linux")]
fn die_with_host(cmd: &mut Command) {
    let parent = std::process::id() as i32;
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (signal, prctl, getppid); it allocates only on its error paths.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(io::Error::other("the host exited before the child started"));
            }
            Ok(())
        });
    }
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "an argument holds a NUL byte"))
}

#[cfg(target_os = "linux")]
mod linux {
    use super::*;
    use std::ptr;

    /// Everything the child needs, made before the clone: between clone and exec it only
    /// reads this and makes system calls (no allocation, no lock).
    struct Setup {
        path: *const libc::c_char,
        argv: *const *const libc::c_char,
        envp: *const *const libc::c_char,
        cwd: *const libc::c_char,
        /// Sources of the child's fds 0, 1 and 2.
        fds: [RawFd; 3],
        parent: libc::pid_t,
        /// The errno of the step that failed, 0 when the exec happened.
        error: libc::c_int,
    }

    /// Whether this kernel gives pidfds that poll readable on exit (5.3 and later): asked
    /// once, with pidfd_open on ourselves. Before 5.2 clone ignores CLONE_PIDFD silently.
    pub fn pollable_pidfds() -> bool {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OK.get_or_init(|| {
            // SAFETY: pidfd_open(2) of our own pid; the fd is closed at once.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
            if fd >= 0 {
                unsafe { libc::close(fd as i32) };
            }
            fd >= 0
        })
    }

    /// None when the kernel refuses the clone itself.
    pub fn start(s: &Start<'_>) -> io::Result<Option<Child>> {
        let path = cstring(s.binary.as_os_str())?;
        let args = std::iter::once(Ok(path.clone())).chain(s.args.iter().map(|a| cstring(OsStr::new(a)))).collect::<io::Result<Vec<_>>>()?;
        // One entry a name, the last given winning, as std's `Command::envs` does.
        let named: std::collections::BTreeMap<&str, &str> = s.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let env = named.iter().map(|(k, v)| cstring(OsStr::new(&format!("{k}={v}")))).collect::<io::Result<Vec<_>>>()?;
        let cwd = s.cwd.map(|c| cstring(c.as_os_str())).transpose()?;
        let argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).chain([ptr::null()]).collect();
        let envp: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).chain([ptr::null()]).collect();

        let (stdin_read, stdin) = if s.stdin_piped {
            let (r, w) = pipe()?;
            (r, Some(w))
        } else {
            (File::open("/dev/null")?, None)
        };
        let (stderr, stderr_write) = pipe()?;
        let mut setup = Setup {
            path: path.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            cwd: cwd.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
            fds: [stdin_read.as_raw_fd(), s.stdout.as_raw_fd(), stderr_write.as_raw_fd()],
            parent: std::process::id() as libc::pid_t,
            error: 0,
        };
        let stack = STACK.with(|s| s.top);
        let mut pidfd: libc::c_int = -1;
        // SAFETY: every signal is blocked across the clone so no handler of the host's runs
        // on the child's stack with the host's memory; the child resets them before it
        // unblocks. CLONE_VFORK suspends this thread until the child has exec'd or exited,
        // so `setup`, the strings it points into and this thread's stack outlive its use,
        // and the stack it runs on is this thread's own (unused by anyone else meanwhile).
        let pid = unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            let pid = libc::clone(
                child_main,
                stack.cast(),
                libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
                (&raw mut setup).cast(),
                &raw mut pidfd,
            );
            let e = io::Error::last_os_error();
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, ptr::null_mut());
            if pid < 0 {
                return match e.raw_os_error() {
                    Some(libc::EINVAL | libc::ENOSYS) => Ok(None),
                    _ => Err(e),
                };
            }
            pid
        };
        // A kernel that ignored CLONE_PIDFD leaves the slot at its -1: a thread reports the
        // exit instead (not reached where pollable_pidfds holds; kept against a surprise).
        let exit = if pidfd >= 0 {
            // SAFETY: CLONE_PIDFD stored a new fd (close-on-exec) for this child here.
            Exit::Pidfd(unsafe { OwnedFd::from_raw_fd(pidfd) })
        } else {
            match report_exit(pid) {
                Ok(f) => Exit::Reported(f),
                Err(e) => {
                    super::super::kill_group(pid);
                    // SAFETY: reaping the child we just killed.
                    unsafe { libc::waitpid(pid, ptr::null_mut(), 0) };
                    return Err(e);
                }
            }
        };
        let mut child = Child::new(pid, stdin, stderr, exit);
        if setup.error != 0 {
            let _ = child.reap();
            return Err(io::Error::from_raw_os_error(setup.error));
        }
        Ok(Some(child))
    }

    /// The child, between clone and exec. Async-signal-safe calls only; on failure it
    /// leaves the errno in `Setup::error` (shared memory) and exits 127.
    extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the parent's `Setup`, alive and untouched while the parent is
        // suspended (CLONE_VFORK); the calls below take pointers made before the clone.
        unsafe {
            let s = &mut *arg.cast::<Setup>();
            unsafe fn fail(s: &mut Setup) -> ! {
                // SAFETY: errno is this thread's (shared with the suspended parent thread).
                unsafe {
                    s.error = *libc::__errno_location();
                    if s.error == 0 {
                        s.error = libc::ECHILD;
                    }
                    libc::_exit(127)
                }
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                fail(s)
            }
            // The host died between the clone and the prctl: do not run as an orphan.
            if libc::getppid() != s.parent {
                *libc::__errno_location() = libc::ESRCH;
                fail(s)
            }
            if libc::setpgid(0, 0) != 0 {
                fail(s)
            }
            // A source that is itself one of 0..2 (a host started with them closed) is
            // first moved out of the way, so no dup2 below overwrites a later source.
            for i in 0..3 {
                if s.fds[i] < 3 && s.fds[i] != i as RawFd {
                    s.fds[i] = libc::fcntl(s.fds[i], libc::F_DUPFD_CLOEXEC, 3);
                    if s.fds[i] < 0 {
                        fail(s)
                    }
                }
            }
            for (i, &fd) in s.fds.iter().enumerate() {
                let ok = if fd == i as RawFd { libc::fcntl(fd, libc::F_SETFD, 0) } else { libc::dup2(fd, i as RawFd) };
                if ok < 0 {
                    fail(s)
                }
            }
            if !s.cwd.is_null() && libc::chdir(s.cwd) != 0 {
                fail(s)
            }
            // The host's handlers (wasmtime's, signal-hook's) must not run here; SIGPIPE,
            // which Rust ignores, is the default again for the child, as std does, and so is
            // SIGXFSZ, which the host ignores (commands::run).
            for sig in 1..=libc::SIGRTMAX() {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, ptr::null(), &mut old) != 0 {
                    continue;
                }
                if (old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN) || sig == libc::SIGPIPE || sig == libc::SIGXFSZ {
                    let mut dfl: libc::sigaction = std::mem::zeroed();
                    dfl.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(sig, &dfl, ptr::null_mut());
                }
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::pthread_sigmask(libc::SIG_SETMASK, &none, ptr::null_mut());
            libc::execve(s.path, s.argv, s.envp);
            fail(s)
        }
    }

    /// The stack a child runs on until its exec: one per thread that starts children,
    /// mapped once, with a guard page below it.
    struct Stack {
        top: *mut u8,
    }

    const STACK_SIZE: usize = 64 * 1024;

    thread_local! {
        static STACK: Stack = Stack::map();
    }

    impl Stack {
        fn map() -> Stack {
            let page = 4096 * 4; // covers 4 KiB and 16 KiB pages
            // SAFETY: a fresh private anonymous mapping; the lowest page becomes the guard.
            unsafe {
                let base = libc::mmap(ptr::null_mut(), STACK_SIZE + page, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK, -1, 0);
                assert!(base != libc::MAP_FAILED, "mapping a child's stack failed: {}", io::Error::last_os_error());
                libc::mprotect(base, page, libc::PROT_NONE);
                Stack { top: base.cast::<u8>().add(STACK_SIZE + page) }
            }
        }
    }

    impl Drop for Stack {
        fn drop(&mut self) {
            let page = 4096 * 4;
            // SAFETY: the mapping made in `map`, no longer used (its thread is ending).
            unsafe {
                libc::munmap(self.top.sub(STACK_SIZE + page).cast(), STACK_SIZE + page);
            }
        }
    }
}
