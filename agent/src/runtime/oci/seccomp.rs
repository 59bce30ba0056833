//! The default seccomp profile of a job's container.
//!
//! It allows system calls by default and refuses, with `EPERM`, those that administer the
//! host or widen the attack surface on the kernel, much as the profiles of Docker and
//! Podman do (tracing stays allowed: a job's processes live in their own PID namespace): loading kernel modules, rebooting, setting the clock, swapping, mounting,
//! keyrings, BPF, perf events, `userfaultfd`, handle-based
//! opens (the "shocker" escape), and creating user namespaces (`unshare`, `clone` with
//! `CLONE_NEWUSER`; `clone3` answers `ENOSYS` so that C libraries fall back to `clone`,
//! whose flags can be checked). With no capabilities, most of these would fail anyway: the
//! profile is the second wall, and the one that stands if a capability is ever granted.

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder, LinuxSeccompBuilder,
    LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};

/// Refused with `EPERM`.
const DENIED: &[&str] = &[
    "acct",
    "add_key",
    "adjtimex",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "init_module",
    "ioperm",
    "iopl",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "mount_setattr",
    "move_mount",
    "move_pages",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "query_module",
    "quotactl",
    "reboot",
    "request_key",
    "setns",
    "settimeofday",
    "swapoff",
    "swapon",
    "sysfs",
    "syslog",
    "umount",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "ustat",
    "vm86",
    "vm86old",
];

const CLONE_NEWUSER: u64 = 0x1000_0000;

fn rule(names: &[&str], errno: u32) -> Option<LinuxSyscall> {
    LinuxSyscallBuilder::default()
        .names(names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
        .action(LinuxSeccompAction::ScmpActErrno)
        .errno_ret(errno)
        .build()
        .ok()
}

/// The profile.
pub fn default_profile() -> Option<LinuxSeccomp> {
    let mut syscalls: Vec<LinuxSyscall> = Vec::new();
    syscalls.extend(rule(DENIED, libc::EPERM as u32));
    syscalls.extend(rule(&["clone3"], libc::ENOSYS as u32));
    // clone(flags, …) with CLONE_NEWUSER set: refused.
    let arg = LinuxSeccompArgBuilder::default()
        .index(0usize)
        .value(CLONE_NEWUSER)
        .value_two(CLONE_NEWUSER)
        .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
        .build()
        .ok()?;
    syscalls.push(
        LinuxSyscallBuilder::default()
            .names(vec!["clone".to_owned()])
            .action(LinuxSeccompAction::ScmpActErrno)
            .errno_ret(libc::EPERM as u32)
            .args(vec![arg])
            .build()
            .ok()?,
    );
    LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActAllow)
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
