//! Hot data streams (Chilimbi, PLDI 2001; Hirzel & Chilimbi section 5.2):
//! the repeated subsequences of a data reference trace that account for
//! most of it. A reference is an (instruction, address) pair; the trace of
//! each independent sequence (a burst, or a complete trace's thread) goes
//! into one locally consistent grammar ([`grammar`]) with a separator no
//! stream can span; its rules are the candidate streams, their uses the number of
//! non-overlapping occurrences, and [`hot`] picks the hot ones and merges
//! them by access signature (the ordered list of their instructions).
//! [`trace`] reads a plain-text trace (another tool's complete trace);
//! [`recent`] keeps a process's newest references for the service's
//! windows.
pub(crate) mod grammar;
pub(crate) mod hot;
pub(crate) mod recent;
pub(crate) mod references;
pub(crate) mod trace;
