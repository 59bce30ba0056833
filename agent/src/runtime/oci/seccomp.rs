//! The default seccomp profile of a job's container: an allow list.
//!
//! Every system call not named here is refused with `EPERM`, including ones kernels add
//! after this list was written. The list is containerd's default profile (and Docker's,
//! which it follows) for a container without capabilities: what ordinary programs, their
//! C libraries and language runtimes call; nothing that administers the host (modules,
//! reboot, clocks, swap, accounting, quotas, mounts and the new mount API, keyrings, BPF,
//! perf events, `kexec`, `syslog`), handle-based opens (the "shocker" escape), `kcmp`,
//! `userfaultfd`, or joining or making namespaces (`setns`, `unshare`, `clone` with a
//! namespace flag; `clone3`, whose flags sit in memory a filter cannot read, answers
//! `ENOSYS`, so C libraries fall back to `clone`). `io_uring` is refused too, as Docker and
//! containerd now do: its rings run system calls' work where no filter sees it.
//!
//! Beyond containerd's list, as Docker allows them: tracing a job's own processes (`ptrace`,
//! `process_vm_readv`/`writev`; debuggers and profilers, confined by the PID namespace), NUMA
//! memory policy (`mbind`, `get_mempolicy`, `set_mempolicy`: GPU data loaders pin memory
//! near their GPU), and the calls of newer kernels that programs now expect (`rseq`,
//! `close_range`, `pidfd_*`, `futex_waitv`, `landlock_*`, `epoll_pwait2`, `membarrier`,
//! `statx`, `faccessat2`, …). `personality` is allowed only for the values that select
//! Linux itself, 32-bit, and the query.
//!
//! With no capabilities, most refused calls would fail anyway: the profile is the second
//! wall, and the one that stands if a capability is ever granted or a kernel bug is found
//! behind a call few programs need.

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompArgBuilder,
    LinuxSeccompBuilder, LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};

/// Allowed whatever their arguments.
pub const ALLOWED: &[&str] = &[
    "accept",
    "accept4",
    "access",
    "alarm",
    "bind",
    "brk",
    "cachestat",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "chown32",
    "clock_getres",
    "clock_getres_time64",
    "clock_gettime",
    "clock_gettime64",
    "clock_nanosleep",
    "clock_nanosleep_time64",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fadvise64_64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "fchown",
    "fchown32",
    "fchownat",
    "fcntl",
    "fcntl64",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstat64",
    "fstatat64",
    "fstatfs",
    "fstatfs64",
    "fsync",
    "ftruncate",
    "ftruncate64",
    "futex",
    "futex_requeue",
    "futex_time64",
    "futex_wait",
    "futex_waitv",
    "futex_wake",
    "futimesat",
    "get_mempolicy",
    "get_robust_list",
    "get_thread_area",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "getegid32",
    "geteuid",
    "geteuid32",
    "getgid",
    "getgid32",
    "getgroups",
    "getgroups32",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresgid32",
    "getresuid",
    "getresuid32",
    "getrlimit",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "gettid",
    "gettimeofday",
    "getuid",
    "getuid32",
    "getxattr",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "io_pgetevents_time64",
    "io_setup",
    "io_submit",
    "ioctl",
    "ioprio_get",
    "ioprio_set",
    "ipc",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lchown32",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listxattr",
    "llistxattr",
    "_llseek",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "lstat64",
    "madvise",
    "map_shadow_stack",
    "mbind",
    "membarrier",
    "memfd_create",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mmap2",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedreceive_time64",
    "mq_timedsend",
    "mq_timedsend_time64",
    "mq_unlink",
    "mremap",
    "mseal",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "nanosleep",
    "newfstatat",
    "_newselect",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_getfd",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "ppoll_time64",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "process_mrelease",
    "process_vm_readv",
    "process_vm_writev",
    "pselect6",
    "pselect6_time64",
    "ptrace",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recv",
    "recvfrom",
    "recvmmsg",
    "recvmmsg_time64",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_sigtimedwait_time64",
    "rt_tgsigqueueinfo",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_rr_get_interval_time64",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "semtimedop_time64",
    "send",
    "sendfile",
    "sendfile64",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "set_mempolicy",
    "set_robust_list",
    "set_thread_area",
    "set_tid_address",
    "setfsgid",
    "setfsgid32",
    "setfsuid",
    "setfsuid32",
    "setgid",
    "setgid32",
    "setgroups",
    "setgroups32",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setregid32",
    "setresgid",
    "setresgid32",
    "setresuid",
    "setresuid32",
    "setreuid",
    "setreuid32",
    "setrlimit",
    "setsid",
    "setsockopt",
    "setuid",
    "setuid32",
    "setxattr",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "sigprocmask",
    "sigreturn",
    "socket",
    "socketcall",
    "socketpair",
    "splice",
    "stat",
    "stat64",
    "statfs",
    "statfs64",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_gettime64",
    "timer_settime",
    "timer_settime64",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_gettime64",
    "timerfd_settime",
    "timerfd_settime64",
    "times",
    "tkill",
    "truncate",
    "truncate64",
    "ugetrlimit",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",
    "utimensat_time64",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "waitpid",
    "write",
    "writev",
    // x86.
    "arch_prctl",
    "modify_ldt",
    // Arm.
    "arm_fadvise64_64",
    "arm_sync_file_range",
    "breakpoint",
    "cacheflush",
    "set_tls",
];

/// The `clone` flags that make namespaces: a `clone` with none of them is allowed.
const CLONE_NAMESPACES: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64;

/// `personality` personas allowed: Linux, 32-bit Linux, `UNAME26` with and without it, and
/// the query (`0xffffffff`).
const PERSONAS: [u64; 5] = [0x0, 0x0008, 0x20000, 0x20008, 0xffff_ffff];

fn syscall(
    names: &[&str],
    action: LinuxSeccompAction,
    errno: Option<u32>,
    args: Vec<LinuxSeccompArg>,
) -> Option<LinuxSyscall> {
    let mut b = LinuxSyscallBuilder::default()
        .names(names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
        .action(action);
    if let Some(errno) = errno {
        b = b.errno_ret(errno);
    }
    if !args.is_empty() {
        b = b.args(args);
    }
    b.build().ok()
}

fn arg(value: u64, value_two: u64, op: LinuxSeccompOperator) -> Option<LinuxSeccompArg> {
    LinuxSeccompArgBuilder::default()
        .index(0usize)
        .value(value)
        .value_two(value_two)
        .op(op)
        .build()
        .ok()
}

/// The profile.
pub fn default_profile() -> Option<LinuxSeccomp> {
    let allow = LinuxSeccompAction::ScmpActAllow;
    let mut syscalls = vec![syscall(ALLOWED, allow, None, Vec::new())?];
    for persona in PERSONAS {
        let only = arg(persona, 0, LinuxSeccompOperator::ScmpCmpEq)?;
        syscalls.push(syscall(&["personality"], allow, None, vec![only])?);
    }
    // clone(flags, …) with no namespace flag set.
    let no_namespaces = arg(CLONE_NAMESPACES, 0, LinuxSeccompOperator::ScmpCmpMaskedEq)?;
    syscalls.push(syscall(&["clone"], allow, None, vec![no_namespaces])?);
    syscalls.push(syscall(
        &["clone3"],
        LinuxSeccompAction::ScmpActErrno,
        Some(libc::ENOSYS as u32),
        Vec::new(),
    )?);
    LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActErrno)
        .default_errno_ret(libc::EPERM as u32)
        .architectures(vec![
            Arch::ScmpArchX86_64,
            Arch::ScmpArchX86,
            Arch::ScmpArchX32,
            Arch::ScmpArchAarch64,
            Arch::ScmpArchArm,
        ])
        .syscalls(syscalls)
        .build()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_refuses_by_default_and_never_allows_the_dangerous_calls() {
        let p = default_profile().expect("profile");
        assert_eq!(p.default_action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(p.default_errno_ret(), Some(libc::EPERM as u32));
        let allowed: Vec<&str> = p
            .syscalls()
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter(|s| s.action() == LinuxSeccompAction::ScmpActAllow && s.args().is_none())
            .flat_map(|s| s.names().iter().map(String::as_str))
            .collect();
        for never in [
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "unshare",
            "setns",
            "mount",
            "umount2",
            "fsopen",
            "move_mount",
            "open_tree",
            "pivot_root",
            "chroot",
            "bpf",
            "perf_event_open",
            "keyctl",
            "add_key",
            "request_key",
            "userfaultfd",
            "kcmp",
            "open_by_handle_at",
            "name_to_handle_at",
            "init_module",
            "finit_module",
            "delete_module",
            "kexec_load",
            "kexec_file_load",
            "reboot",
            "swapon",
            "acct",
            "quotactl",
            "settimeofday",
            "clock_settime",
            "clock_adjtime",
            "adjtimex",
            "syslog",
            "sethostname",
            "personality",
            "clone",
            "clone3",
        ] {
            assert!(!allowed.contains(&never), "{never} is allowed outright");
        }
        let mut sorted = ALLOWED.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ALLOWED.len(), "each call named once");
    }
}
