//! A module's first analysis and generation, in a process of its own: a
//! plan cache entry. The daemon runs `burstyd prepare-module` (itself,
//! `/proc/self/exe`) with the module's file (as mapped) for its standard
//! input; the worker analyses and generates them for a provisional layout near the
//! module, stores the entry in the plan cache, reports on its standard
//! output and exits. The daemon then moves the entry's clones to the real
//! layout like any cached ones ([`super::plans`]).
//!
//! Why a process: the first analysis and generation of a large module
//! need a lot of memory for a short time (python3.11: 470 MB), which a
//! daemon that runs for weeks should neither hold nor keep fragmented
//! afterwards; the worker's whole heap goes back at its exit. A module the
//! analysis cannot handle (a panic, a runaway) takes down the worker, not
//! the daemon: the module is then analysed in the daemon (said once) or,
//! if that fails too, left uncloned.
//!
//! The worker prints how far it is (`progress STAGE DONE TOTAL`, a few
//! lines a second) before its report; the daemon passes them on to
//! [`super::progress`].
//!
//! Without a plan cache (`--no-cache`, an untrusted directory) there is no
//! entry to hand over: the daemon analyses in its own process.
use std::os::fd::AsFd as _;
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};

use super::cache;
use super::modules::Module;
use super::prepare::WorkerReport;
use userspace_rewriter::progress::Stage;

/// The worker's command line, from the daemon (`burstyd prepare-module`,
/// hidden).
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct WorkerArgs {
    /// The module's key in the plan cache (the bytes read must have it).
    #[arg(long)]
    key: String,
    /// Its path as the process maps it.
    #[arg(long)]
    path: String,
    #[arg(long)]
    bias: u64,
    #[arg(long)]
    lo: u64,
    #[arg(long)]
    hi: u64,
    #[arg(long)]
    ino: u64,
    #[arg(long)]
    exe: bool,
    #[arg(long)]
    cache_dir: std::path::PathBuf,
    #[arg(long)]
    cache_max_mb: u64,
    /// Memory mode: `Data` or `All` (absent: off).
    #[arg(long)]
    refs: Option<String>,
    /// Value tuples in the clones.
    #[arg(long)]
    values: bool,
    /// Target tuples in the clones.
    #[arg(long)]
    targets: bool,
}

/// Has a worker make `module`'s cache entry under `key`, and waits for
/// it. `Err` when the worker could not run, failed or stored nothing.
pub(crate) fn prepare(module: &Module, key: &str) -> anyhow::Result<WorkerReport> {
    let cache = cache::get().context("no plan cache to hand the entry over")?;
    let mut child = Command::new("/proc/self/exe")
        .arg("prepare-module")
        .args(["--key", key, "--path", &module.path])
        .args(["--bias", &module.bias.to_string()])
        .args(["--lo", &module.range.0.to_string()])
        .args(["--hi", &module.range.1.to_string()])
        .args(["--ino", &module.ino.to_string()])
        .args(module.is_exe.then_some("--exe"))
        .arg("--cache-dir")
        .arg(cache.dir())
        .args(["--cache-max-mb", &cache.max_mb().to_string()])
        .args(
            (module.rec.refs != userspace_rewriter::codegen::Refs::Off)
                .then(|| format!("--refs={:?}", module.rec.refs)),
        )
        .args(module.rec.values.then_some("--values"))
        .args(module.rec.targets.then_some("--targets"))
        .stdin(Stdio::from(
            module
                .file
                .try_clone()
                .context("handing the module's file over")?,
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the worker process")?;
    let (status, out, err) = wait_reporting(&mut child).context("waiting for the worker")?;
    if !status.success() {
        let last = err.lines().last().unwrap_or("").trim();
        bail!("the worker process failed ({status}): {last}");
    }
    serde_json::from_str(out.trim()).with_context(|| format!("the worker's report {out:?}"))
}

/// A worker's progress line on its standard output: `progress STAGE DONE
/// TOTAL` (functions of a stage done; see `userspace_rewriter::progress`).
const PROGRESS: &str = "progress ";

fn parse_progress(line: &str) -> Option<(Stage, usize, usize)> {
    let mut w = line.strip_prefix(PROGRESS)?.split(' ');
    let stage = Stage::from_name(w.next()?)?;
    Some((stage, w.next()?.parse().ok()?, w.next()?.parse().ok()?))
}

/// Waits for the worker, passing its progress lines on to
/// [`super::progress::report`] (this thread's module) as they come.
/// Returns its exit status, its other standard output (the report) and
/// its standard error.
fn wait_reporting(
    child: &mut std::process::Child,
) -> std::io::Result<(std::process::ExitStatus, String, String)> {
    use std::io::{BufRead as _, Read as _};
    let mut stderr = child.stderr.take();
    let stdout = child.stdout.take();
    let (out, err) = std::thread::scope(|s| {
        let err = s.spawn(move || {
            let mut e = String::new();
            if let Some(x) = stderr.as_mut() {
                let _ = x.read_to_string(&mut e);
            }
            e
        });
        let mut out = String::new();
        if let Some(x) = stdout {
            for line in std::io::BufReader::new(x).lines() {
                let Ok(line) = line else { break };
                match parse_progress(&line) {
                    Some((stage, n, total)) => super::progress::report(stage, n, total),
                    None => {
                        out.push_str(&line);
                        out.push('\n');
                    }
                }
            }
        }
        (out, err.join().unwrap_or_default())
    });
    Ok((child.wait()?, out, err))
}

/// In the worker: the rewriter's progress as lines on standard output, a
/// stage's first and last and at most four a second between.
fn print_progress() -> impl FnMut(Stage, usize, usize) + 'static {
    let mut last: Option<(Stage, std::time::Instant)> = None;
    move |stage, n, total| {
        let now = std::time::Instant::now();
        let due = match last {
            Some((st, t)) => st != stage || n >= total || now.duration_since(t).as_millis() >= 250,
            None => true,
        };
        if due {
            last = Some((stage, now));
            println!("{PROGRESS}{} {n} {total}", stage.name());
        }
    }
}

/// The worker: analyses and generates the module whose file is its
/// standard input, stores the entry, prints its [`WorkerReport`]. Its exit
/// status says whether the entry was stored.
pub(crate) fn run(args: &WorkerArgs) -> anyhow::Result<()> {
    let file = std::fs::File::from(
        std::io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .context("the module's file")?,
    );
    let mut module = Module::from_file(
        &args.path,
        file,
        (args.lo, args.hi),
        args.bias,
        args.exe,
        args.ino,
    )?;
    module.rec.refs = match args.refs.as_deref() {
        None => userspace_rewriter::codegen::Refs::Off,
        Some("Data") => userspace_rewriter::codegen::Refs::Data,
        Some("All") => userspace_rewriter::codegen::Refs::All,
        Some(other) => bail!("unknown memory mode {other}"),
    };
    module.rec.values = args.values;
    module.rec.targets = args.targets;
    if module.key() != args.key {
        bail!("the file read is not that of key {}", args.key);
    }
    let id = module.hash;
    cache::init(Some(args.cache_dir.clone()), args.cache_max_mb);
    let t0 = std::time::Instant::now();
    let (analysis_ms, generation_ms) =
        userspace_rewriter::progress::with_hook(print_progress(), || {
            super::prepare::prepare_entry(module, id, &args.key)
        })?;
    let report = WorkerReport {
        analysis_ms,
        generation_ms,
        peak_rss_bytes: crate::sys::self_peak_rss(),
    };
    tracing::debug!(
        "prepared {} in {:.0} ms",
        args.path,
        t0.elapsed().as_secs_f64() * 1e3
    );
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_are_told_from_the_report() {
        assert_eq!(
            parse_progress("progress clones 12 345"),
            Some((Stage::Clones, 12, 345))
        );
        assert_eq!(parse_progress("progress soup 1 2"), None);
        assert_eq!(parse_progress(r#"{"analysis_ms":1}"#), None);
    }
}
