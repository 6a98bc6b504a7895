//! A module's DWARF read in a process of its own: the daemon runs
//! `burstyd symbolize-dwarf --file FILE` (itself, `/proc/self/exe`) with
//! the addresses (SVMAs, one per line) on its standard input; the worker
//! opens the file's DWARF ([`Dwarf`]), answers each address and prints the
//! answers as one JSON document on its standard output.
//!
//! Why a process: opening a module's DWARF parses every compilation
//! unit's header and abbreviations at once (`addr2line`), and a large
//! debug file costs tens of MB for the moment a profile is symbolized:
//! libc's separate debug file, 29 MB of the daemon's 56 MB heap peak while
//! it traced redis (heaptrack, 2026-11-27), every interval that met new
//! addresses in libc. In a worker, that memory is the worker's, and all of
//! it goes back at its exit; the daemon, which runs for weeks, neither
//! peaks with it nor keeps its heap fragmented by it. DWARF is also input
//! the daemon does not control: a file that makes the parser panic or run
//! away takes down the worker, not the daemon (its module is then
//! symbolized from its symbol table, said once).
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

use super::dwarf::{Dwarf, FoundFrame};

/// What DWARF says at one SVMA: its frames (innermost first), or, when it
/// has none there, the line table's file and line.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Answer {
    pub(crate) frames: Vec<FoundFrame>,
    pub(crate) location: Option<(Option<String>, Option<u32>)>,
}

impl Answer {
    /// Looks `svma` up in `dwarf` (in whichever process holds it).
    pub(crate) fn of(dwarf: &Dwarf, svma: u64) -> Answer {
        let frames = dwarf.find_frames(svma).unwrap_or_else(|e| {
            tracing::debug!(svma, error = %e, "DWARF lookup failed");
            Vec::new()
        });
        let location = if frames.is_empty() {
            dwarf.find_location(svma)
        } else {
            None
        };
        Answer { frames, location }
    }
}

/// The worker's output.
#[derive(Debug, Serialize, Deserialize)]
struct Report {
    /// One per address asked, in order.
    answers: Vec<Answer>,
    /// The worker's peak RSS.
    peak_rss_bytes: u64,
}

/// The worker's command line (`burstyd symbolize-dwarf`, hidden).
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct DwarfWorkerArgs {
    /// The ELF file whose DWARF answers (the module, or its separate
    /// debug file).
    #[arg(long)]
    file: PathBuf,
}

/// The largest peak RSS of a DWARF worker process so far
/// (`burstyd_dwarf_worker_peak_rss_bytes`).
pub(crate) static PEAK_RSS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Has a worker answer `svmas` from `file`'s DWARF, and waits for it.
/// Returns the answers in order and the worker's peak RSS. `file` may be
/// one of this process's descriptors (`/proc/self/fd/N`): the worker opens
/// it through this process's pid.
pub(crate) fn answers(file: &Path, svmas: &[u64]) -> anyhow::Result<(Vec<Answer>, u64)> {
    let file = match file.strip_prefix("/proc/self/") {
        Ok(rest) => Path::new("/proc")
            .join(std::process::id().to_string())
            .join(rest),
        Err(_) => file.to_path_buf(),
    };
    let mut child = Command::new("/proc/self/exe")
        .arg("symbolize-dwarf")
        .arg("--file")
        .arg(&file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the DWARF worker")?;
    let input: String = svmas.iter().map(|a| format!("{a:x}\n")).collect();
    let (status, out, err) = crate::sys::collect_child(&mut child, input.into_bytes())
        .context("waiting for the DWARF worker")?;
    if !status.success() {
        let last = err.lines().last().unwrap_or("").trim();
        bail!("the DWARF worker failed ({status}): {last}");
    }
    let r: Report = serde_json::from_slice(&out).context("the DWARF worker's answers")?;
    if r.answers.len() != svmas.len() {
        bail!(
            "the DWARF worker answered {} of {} addresses",
            r.answers.len(),
            svmas.len()
        );
    }
    PEAK_RSS.fetch_max(r.peak_rss_bytes, std::sync::atomic::Ordering::Relaxed);
    Ok((r.answers, r.peak_rss_bytes))
}

/// The worker: reads hex SVMAs, one per line, from its standard input,
/// opens `args.file`'s DWARF and prints the [`Report`].
pub(crate) fn run(args: &DwarfWorkerArgs) -> anyhow::Result<()> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .context("reading the addresses")?;
    let svmas = input
        .lines()
        .map(|l| u64::from_str_radix(l.trim(), 16).with_context(|| format!("address {l:?}")))
        .collect::<anyhow::Result<Vec<u64>>>()?;
    let dwarf = Dwarf::open(&args.file)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("opening the DWARF of {}", args.file.display()))?;
    let answers = svmas.iter().map(|&a| Answer::of(&dwarf, a)).collect();
    let report = Report {
        answers,
        peak_rss_bytes: crate::sys::self_peak_rss(),
    };
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, &report)?;
    out.flush()?;
    Ok(())
}
