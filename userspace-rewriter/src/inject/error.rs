//! [`InjectError`]: how attaching to and injecting into a process fails.

use std::time::Duration;

use burstyd_common::addr::Pid;

/// Errors of attaching to and injecting into a process.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("no such process: {0}")]
    NoSuchProcess(Pid),
    #[error("{pid} is a thread of process {tgid}, not a process id")]
    NotAProcess { pid: Pid, tgid: Pid },
    #[error("process {0} is a zombie (it has exited and waits to be reaped)")]
    Zombie(Pid),
    #[error(
        "process {pid} is already traced by process {tracer} (a debugger, strace, or another \
         burstyd); a process can have only one tracer"
    )]
    AlreadyTraced { pid: Pid, tracer: i32 },
    #[error("not permitted to ptrace process {pid} (EPERM): {hint}")]
    NotPermitted { pid: Pid, hint: String },
    #[error("cannot attach to our own process ({0})")]
    OwnProcess(Pid),
    #[error("process {pid} ended while attached: {how}")]
    Exited { pid: Pid, how: String },
    #[error("{call} on thread {tid}: {source}")]
    Ptrace {
        call: &'static str,
        tid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("syscall {nr} in process {pid} failed: {}", std::io::Error::from_raw_os_error(*.errno))]
    Syscall { pid: Pid, nr: i64, errno: i32 },
    #[error("no `syscall` instruction (0f 05) in any executable mapping of process {0}")]
    NoSyscallInstruction(Pid),
    #[error(
        "call of {func:#x} in process {pid} did not return within {timeout:?} (waiting for a \
         lock another, stopped, thread holds?); the thread was put back, but whatever the \
         function did so far stays done"
    )]
    CallTimeout {
        pid: Pid,
        func: u64,
        timeout: Duration,
    },
    #[error(
        "call of {func:#x} in process {pid} faulted: signal {signal} at rip {rip:#x} (fault \
         address {addr:#x}); the thread was put back"
    )]
    CallFaulted {
        pid: Pid,
        func: u64,
        signal: i32,
        rip: u64,
        addr: u64,
    },
    #[error("{0} arguments given; at most 6 are supported")]
    TooManyArguments(usize),
    #[error("mmap in process {pid} asked for {wanted:#x} and got {got:#x}")]
    MmapMoved { pid: Pid, wanted: u64, got: u64 },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error(
        "no free gap of {len:#x} bytes within ±2 GiB of every byte of [{lo:#x}, {hi:#x}) in \
         process {pid}"
    )]
    NoGap {
        pid: Pid,
        lo: u64,
        hi: u64,
        len: u64,
    },
    #[error(
        "process {0} catches, ignores, blocks or has pending every signal from SIGRTMIN+2 (34) \
         to SIGRTMAX (64)"
    )]
    NoFreeSignal(Pid),
    #[error("thread {tid}: unexpected {what}")]
    Unexpected { tid: i32, what: String },
    #[error(
        "process {0} runs in seccomp strict mode: it may make no system call but read, write, \
         exit and sigreturn, and injecting the clones needs others"
    )]
    SeccompStrict(Pid),
    #[error(
        "the seccomp filter of process {pid} {action} on {syscall}, which injecting the clones \
         needs; nothing was injected"
    )]
    SeccompRefuses {
        pid: Pid,
        syscall: String,
        action: String,
    },
    #[error("cannot parse {what}: {text:?}")]
    Parse { what: String, text: String },
}

pub(super) type Result<T, E = InjectError> = std::result::Result<T, E>;
