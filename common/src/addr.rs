//! Process ids and the address spaces burstyd works in, as types.
//!
//! Three kinds of address meet in a profiler (the vocabulary is framehop's
//! and samply's):
//! - an **AVMA** ([`Avma`], "actual virtual memory address") is an address
//!   in the running process: a sampled `rip`, a return address on its stack,
//!   where an injected clone lives;
//! - an **SVMA** ([`Svma`], "stated virtual memory address") is the address
//!   the ELF file states for the same byte: symbols, DWARF, `.eh_frame` and
//!   the rewriter's plan all speak SVMAs;
//! - the **bias** ([`Bias`]) of one mapped module is `AVMA − SVMA`, the same
//!   for every byte of that module. Take `/usr/bin/xz` (PIE), whose first
//!   `PT_LOAD` states `p_vaddr 0x0` and which the kernel mapped at
//!   `0x5555_5555_4000`: its bias is `0x5555_5555_4000`, and the SVMA
//!   `0x3a10` of a function is the AVMA `0x5555_5555_7a10`. A non-PIE
//!   executable has bias 0. (Biases are computed modulo 2^64: a module
//!   loaded below its stated addresses has a "negative" bias.)
//!
//! A frame of an unwound stack is either the interrupted instruction pointer
//! (the leaf) or a return address (every caller): [`FrameAddress`] keeps
//! that distinction, because a return address points *after* the call, so
//! symbol and CFI lookups must use `address − 1` to land inside the call
//! instruction (which may be the last instruction of its function, or the
//! last instruction of an inlined call).
//!
//! A process id is a [`Pid`]: the kernel's tgid (a process, not a thread).
//! The kernel and BPF call it `u32` (`bpf_get_current_pid_tgid() >> 32`),
//! libc calls it `pid_t` (`i32`); [`Pid::raw`] gives the latter.
use core::fmt;
use core::ops::{Add, Sub};

/// A process id (the kernel's tgid).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Pid(pub u32);

impl Pid {
    /// As libc's `pid_t`, for system calls. Pids are below 2^22 (the
    /// kernel's `PID_MAX_LIMIT`), so this never wraps.
    pub const fn raw(self) -> i32 {
        self.0 as i32
    }
}

impl From<u32> for Pid {
    fn from(p: u32) -> Self {
        Pid(p)
    }
}

impl fmt::Display for Pid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Pid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

macro_rules! address {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[repr(transparent)]
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub u64);

        impl $name {
            /// The address `n` bytes further.
            pub const fn offset(self, n: u64) -> Self {
                $name(self.0.wrapping_add(n))
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:#x})", stringify!($name), self.0)
            }
        }

        impl fmt::LowerHex for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::LowerHex::fmt(&self.0, f)
            }
        }
    };
}

address!(
    /// An address in the running process (see the module doc).
    Avma
);
address!(
    /// An address as the ELF file states it (see the module doc).
    Svma
);

/// `AVMA − SVMA` of one mapped module (modulo 2^64).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Bias(pub u64);

impl Bias {
    /// The bias that maps `stated` to `actual`.
    pub const fn between(actual: Avma, stated: Svma) -> Self {
        Bias(actual.0.wrapping_sub(stated.0))
    }
}

impl fmt::Debug for Bias {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bias({:#x})", self.0)
    }
}

impl Add<Bias> for Svma {
    type Output = Avma;
    fn add(self, b: Bias) -> Avma {
        Avma(self.0.wrapping_add(b.0))
    }
}

impl Sub<Bias> for Avma {
    type Output = Svma;
    fn sub(self, b: Bias) -> Svma {
        Svma(self.0.wrapping_sub(b.0))
    }
}

/// One frame of an unwound stack: the interrupted instruction, or a return
/// address (see the module doc).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum FrameAddress {
    /// The leaf frame's instruction pointer: it points at the instruction
    /// that was about to run.
    InstructionPointer(Avma),
    /// A caller's return address: it points after the call instruction.
    ReturnAddress(Avma),
}

impl FrameAddress {
    /// The address itself, as found in the registers or on the stack.
    pub const fn address(self) -> Avma {
        match self {
            FrameAddress::InstructionPointer(a) | FrameAddress::ReturnAddress(a) => a,
        }
    }

    /// The address to look symbols, lines and CFI up with: the instruction
    /// pointer itself, or one byte before a return address (inside the
    /// call).
    pub const fn lookup_address(self) -> Avma {
        match self {
            FrameAddress::InstructionPointer(a) => a,
            FrameAddress::ReturnAddress(a) => Avma(a.0.wrapping_sub(1)),
        }
    }

    pub const fn is_return_address(self) -> bool {
        matches!(self, FrameAddress::ReturnAddress(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_maps_stated_to_actual_and_back() {
        // xz (PIE) mapped at 0x5555_5555_4000, p_vaddr 0.
        let bias = Bias::between(Avma(0x5555_5555_4000), Svma(0));
        assert_eq!(Svma(0x3a10) + bias, Avma(0x5555_5555_7a10));
        assert_eq!(Avma(0x5555_5555_7a10) - bias, Svma(0x3a10));
        // A module loaded below its stated addresses: the bias wraps.
        let low = Bias::between(Avma(0x1000), Svma(0x40_1000));
        assert_eq!(Svma(0x40_1234) + low, Avma(0x1234));
        assert_eq!(Avma(0x1234) - low, Svma(0x40_1234));
    }

    #[test]
    fn return_addresses_are_looked_up_inside_the_call() {
        let ra = FrameAddress::ReturnAddress(Avma(0x1005));
        assert_eq!(ra.lookup_address(), Avma(0x1004));
        assert_eq!(ra.address(), Avma(0x1005));
        assert!(ra.is_return_address());
        let ip = FrameAddress::InstructionPointer(Avma(0x1005));
        assert_eq!(ip.lookup_address(), Avma(0x1005));
        assert!(!ip.is_return_address());
    }

    #[test]
    fn pids_are_pid_t_for_libc() {
        assert_eq!(Pid(4_194_304).raw(), 4_194_304);
        assert_eq!(Pid::from(7u32), Pid(7));
    }
}
