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
//! Without a plan cache (`--no-cache`, an untrusted directory) there is no
//! entry to hand over: the daemon analyses in its own process.
use std::os::fd::AsFd as _;
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};

use super::cache;
use super::modules::Module;
use super::prepare::WorkerReport;

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
            (module.refs != userspace_rewriter::codegen::Refs::Off)
                .then(|| format!("--refs={:?}", module.refs)),
        )
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
    let (status, out, err) =
        crate::sys::collect_child(&mut child, Vec::new()).context("waiting for the worker")?;
    let out = String::from_utf8_lossy(&out);
    if !status.success() {
        let last = err.lines().last().unwrap_or("").trim();
        bail!("the worker process failed ({status}): {last}");
    }
    serde_json::from_str(out.trim()).with_context(|| format!("the worker's report {out:?}"))
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
    module.refs = match args.refs.as_deref() {
        None => userspace_rewriter::codegen::Refs::Off,
        Some("Data") => userspace_rewriter::codegen::Refs::Data,
        Some("All") => userspace_rewriter::codegen::Refs::All,
        Some(other) => bail!("unknown memory mode {other}"),
    };
    if module.key() != args.key {
        bail!("the file read is not that of key {}", args.key);
    }
    let id = module.hash;
    cache::init(Some(args.cache_dir.clone()), args.cache_max_mb);
    let t0 = std::time::Instant::now();
    let (analysis_ms, generation_ms) = super::prepare::prepare_entry(module, id, &args.key)?;
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
