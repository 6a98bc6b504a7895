//! burstyd: a near-zero-overhead profiler for native Linux programs.
//!
//! This file parses the command line, picks the event, starts the sampler
//! and runs a session. The modules, in pipeline order (what each produces):
//! - [`sampling`]: the perf event ([`sampling::events`]) and the eBPF
//!   program with its ring buffer ([`sampling::sampler`]) → raw samples
//!   (registers, a user stack copy, a kernel stack).
//! - [`stacks`]: raw samples → call stacks (maps snapshots, ELF modules,
//!   CFI unwinding) → calling context trees per thread; addresses →
//!   functions, files and lines (symbolization).
//! - [`bursts`]: bursty tracing of `--pid`/`run` targets: injected clones
//!   (attach, re-arm, detach), the shared record ring → `BurstEvent`s →
//!   path counts per calling context within a burst.
//! - [`export`]: trees and path counts → pprof (`context.pb.gz`,
//!   `paths.pb.gz`) and BOLT's `edges.fdata`, written atomically.
//! - [`session`]: the event loop tying them together: samples, interval
//!   and final profiles, HTTP requests, reloads, bursts, shutdown.
//! - [`service`]: configuration file, configured targets, HTTP endpoint,
//!   push to Pyroscope/Parca, metrics, systemd notifications.
//! - [`cli`]: the command line; [`analyze`]: `burstyd analyze`, the
//!   rewriter's plan of a binary; [`sys`]: the raw syscalls and /proc
//!   checks the daemon makes itself.
mod analyze;
mod bursts;
mod cli;
mod export;
mod hot_paths;
mod hot_streams;
mod sampling;
mod service;
mod session;
mod stacks;
mod streams;
mod sys;
mod values;
mod words;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::time::Duration;

use crate::cli::{Cli, Command, ProfileArgs};
use crate::sampling::events;
use crate::sampling::sampler::{Sampler, SamplerOptions};
use crate::service::config;
use crate::service::settings::{Overrides, Settings};
use crate::session::SessionOptions;
use anyhow::{Context as _, bail};
use burstyd_common::addr::Pid;
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};

fn main() {
    if let Some(fd) = std::env::var_os(GATE_ENV) {
        let argv: Vec<_> = std::env::args_os().skip(1).collect();
        exec_gate(&fd.to_string_lossy(), &argv);
    }
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Some(Command::Analyze {
        file,
        json,
        function,
        dot,
        plan,
        profile,
        k,
    }) = &cli.command
    {
        let opts = crate::analyze::AnalyzeOptions {
            json: *json,
            function: function.as_deref(),
            dot: *dot,
            plan_out: plan.as_deref(),
            profile: profile.as_deref(),
            k: *k,
        };
        if let Err(e) = crate::analyze::run(file, &opts) {
            eprintln!("burstyd: error: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if let Some(Command::HotPaths {
        profile,
        metric,
        threshold,
        top,
        json,
    }) = &cli.command
    {
        let opts = crate::hot_paths::HotPathOptions {
            metric: metric.as_deref(),
            threshold_pct: *threshold,
            top: *top,
            json: *json,
        };
        if let Err(e) = crate::hot_paths::run(profile, &opts) {
            eprintln!("burstyd: error: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if let Some(Command::HotStreams {
        profile,
        from_trace,
        min_len,
        max_len,
        coverage,
        top,
        json,
    }) = &cli.command
    {
        let opts = crate::hot_streams::HotStreamOptions {
            hot: crate::streams::hot::HotOptions {
                min_len: *min_len,
                max_len: *max_len,
                coverage: coverage / 100.0,
            },
            top: *top,
            json: *json,
        };
        let done = match (from_trace, profile) {
            (Some(trace), _) => crate::hot_streams::run(trace, &opts),
            (None, Some(out)) => crate::hot_streams::show(out, &opts),
            (None, None) => unreachable!("clap requires one"),
        };
        if let Err(e) = done {
            eprintln!("burstyd: error: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if let Some(Command::Values {
        profile,
        targets,
        top,
        values,
        min_exec,
        json,
    }) = &cli.command
    {
        let opts = crate::values::ValueOptions {
            targets: *targets,
            top: *top,
            values: *values,
            error: crate::bursts::tuples::ErrorOptions {
                min_exec: *min_exec,
                ..Default::default()
            },
            json: *json,
        };
        if let Err(e) = crate::values::run(profile, &opts) {
            eprintln!("burstyd: error: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if let Some(Command::PrepareModule(args)) = &cli.command {
        init_logging(0);
        if let Err(e) = crate::bursts::worker::run(args) {
            eprintln!("burstyd prepare-module: error: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if let Some(Command::SymbolizeDwarf(args)) = &cli.command {
        init_logging(0);
        if let Err(e) = crate::stacks::dwarf_worker::run(args) {
            eprintln!("burstyd symbolize-dwarf: error: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    // SIGINT/SIGTERM/SIGHUP wait, pending, for the session to read them
    // (see session::command): blocked now, before any thread starts, so
    // that no thread takes them with their default action (which would
    // kill burstyd and abandon `run`'s command).
    if let Err(e) = crate::sys::block_session_signals() {
        eprintln!("burstyd: error: blocking signals: {e}");
        std::process::exit(1);
    }
    let args = match &cli.command {
        Some(Command::Run { profile, .. }) => profile.clone(),
        _ => cli.profile.clone(),
    };
    init_logging(args.verbose);
    // One thread runs the session: samples arrive in batches, and a second
    // thread would only add cross-thread wakeups. (Bursty tracing attaches
    // on a thread of its own and detaches on the blocking pool: both block
    // for seconds.)
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("burstyd: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let overrides = overrides(&cli, &args, &matches);
    match rt.block_on(real_main(cli, args, overrides)) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("burstyd: error: {}", error_chain(&e));
            std::process::exit(1);
        }
    }
}

/// An error and its causes, `: `-separated like `{:#}`, but without a
/// cause its parent's message already ends with (error types that both
/// print their source and return it, as aya's `SyscallError` behind a
/// transparent `ProgramError` does: "`perf_event_open` failed:
/// `perf_event_open` failed: ...").
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let msg = cause.to_string();
        if out.ends_with(&msg) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&msg);
    }
    out
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("BURSTYD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(log_colour())
        .with_target(false)
        .init();
    // aya-log forwards eBPF-side log records through the `log` crate.
    let _ = tracing_log_bridge();
}

/// Whether log lines get colour: on a terminal only, never into a file,
/// a pipe or the journal (`JOURNAL_STREAM`: systemd's stderr is a socket
/// to it), and never with `NO_COLOR` set (no-color.org).
fn log_colour() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal()
        && std::env::var_os("JOURNAL_STREAM").is_none()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Routes `log` records (aya-log's eBPF messages) into tracing.
fn tracing_log_bridge() -> Result<(), log::SetLoggerError> {
    struct Bridge;
    impl log::Log for Bridge {
        fn enabled(&self, _: &log::Metadata) -> bool {
            true
        }
        fn log(&self, r: &log::Record) {
            match r.level() {
                log::Level::Error => tracing::error!("ebpf: {}", r.args()),
                log::Level::Warn => tracing::warn!("ebpf: {}", r.args()),
                log::Level::Info => tracing::info!("ebpf: {}", r.args()),
                _ => tracing::debug!("ebpf: {}", r.args()),
            }
        }
        fn flush(&self) {}
    }
    log::set_boxed_logger(Box::new(Bridge)).map(|()| log::set_max_level(log::LevelFilter::Info))
}

/// The profile flags given on the command line (not clap defaults): they
/// override the configuration file.
fn overrides(cli: &Cli, args: &ProfileArgs, matches: &ArgMatches) -> Overrides {
    let m = matches.subcommand_matches("run").unwrap_or(matches);
    let given = |id: &str| m.value_source(id) == Some(ValueSource::CommandLine);
    Overrides {
        event: given("event").then(|| args.event.clone()),
        period: args.period,
        freq: args.freq,
        interval: args.interval,
        output: given("output").then(|| args.output.clone()),
        no_kernel: args.no_kernel,
        http: cli.service().http.clone(),
        pids: cli.pids.clone(),
        no_bursts: args.no_bursts,
        burst: given("burst").then_some(args.burst),
        path_time: args.path_time,
        exe_only: args.exe_only,
        max_bursts: args.max_bursts,
        weights: args.weights,
        record: args.record.clone(),
        refs_stack: args.refs_stack,
        refs_burst: args.refs_burst,
        sampler: args.sampler,
        sample_rate: args.sample_rate,
        strata: args.strata,
        sampler_reference: args.sampler_reference,
    }
}

/// Reads the configuration file (if any) and applies the overrides.
fn settings(
    cli: &Cli,
    overrides: &Overrides,
) -> anyhow::Result<(Option<config::Source>, Settings)> {
    let is_run = matches!(cli.command, Some(Command::Run { .. }));
    let service = cli.service();
    let source = match (&service.config, service.no_config) {
        (_, true) => None,
        (Some(p), _) => Some(config::Source {
            path: p.clone(),
            explicit: true,
        }),
        // `run` profiles one command; a service's file is not meant for it.
        (None, _) if is_run => None,
        (None, _) => Some(config::Source {
            path: config::DEFAULT_PATH.into(),
            explicit: false,
        }),
    };
    let file = match &source {
        Some(s) => config::load(s)?,
        None => None,
    };
    if let (Some(s), Some(_)) = (&source, &file) {
        tracing::info!("configuration: {}", s.path.display());
    }
    let settings = Settings::resolve(
        file.as_ref(),
        source.as_ref().map(|s| s.path.as_path()),
        overrides,
    )?;
    Ok((source, settings))
}

async fn real_main(cli: Cli, args: ProfileArgs, overrides: Overrides) -> anyhow::Result<i32> {
    if unsafe { libc::geteuid() } != 0 {
        tracing::warn!("not running as root: loading eBPF needs CAP_BPF and CAP_PERFMON");
    }
    let pids: Vec<Pid> = cli.pids.iter().copied().map(Pid).collect();
    session::check_targets(&pids)?;
    let (source, settings) = settings(&cli, &overrides)?;
    let requested = events::parse_event(&settings.event)?;
    preflight()?;
    let event = events::resolve_supported(requested.clone()).map_err(|e| match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => anyhow::anyhow!(
            "not permitted to open perf events ({e}): run burstyd as root, or grant it CAP_PERFMON and CAP_BPF"
        ),
        Some(libc::ENOSYS) => anyhow::anyhow!("this kernel has no perf events support (perf_event_open: {e})"),
        _ => anyhow::Error::new(e).context(format!("opening a perf event for `{}`", requested.name)),
    })?;
    let requested_event = (event.name != requested.name).then(|| requested.name.clone());
    let sampling = settings.sampling;
    let secs = |s: Option<f64>, what: &str| -> anyhow::Result<Option<Duration>> {
        s.map(|v| {
            Duration::try_from_secs_f64(v)
                .ok()
                .filter(|d| !d.is_zero())
                .with_context(|| format!("--{what} must be a positive number of seconds"))
        })
        .transpose()
    };
    let duration = secs(args.duration, "duration")?;
    let interval = settings.interval;
    // What would otherwise fail only once the command runs, or at the end.
    events::check_sampling(sampling)?;
    crate::export::check_output_dir(&settings.output)?;

    // `run`: fork the command now but hold it before exec until the sampler
    // records its pid, so its first instructions are already sampled.
    let mut gate: Option<OwnedFd> = None;
    let mut child = None;
    let targets = match &cli.command {
        Some(Command::Run { command, .. }) => {
            let (c, g, report) = spawn_gated(command)?;
            gate = Some(g);
            let pid = c.id().context("the command exited before it started")?;
            child = Some((c, report));
            Some(vec![Pid(pid)])
        }
        _ if !pids.is_empty() => Some(pids.clone()),
        _ => None,
    };
    // Targets from the configuration file: the pids matching now, and more
    // as they appear (the session rescans).
    let mut scanner = None;
    let mut initial = targets.clone();
    if targets.is_none() && !settings.targets.is_empty() {
        let mut s = crate::service::targets::Scanner::new(
            settings.targets.clone(),
            settings.bursts.enabled,
        );
        let found = s.scan().added;
        initial = Some(found);
        scanner = Some(s);
    }
    let sampler = match Sampler::start(&SamplerOptions {
        event: event.clone(),
        sampling,
        targets: initial.clone(),
        kernel_stacks: settings.kernel_stacks,
        follow_children: child.is_some(),
        follow_exec: settings.bursts.enabled,
    }) {
        Ok(s) => s,
        Err(e) => {
            // The command has not started: its gate dies with the pipe
            // still shut, so that it never runs unprofiled and unwaited.
            if let Some((mut c, _)) = child.take() {
                let _ = c.start_kill();
                let _ = c.wait().await;
            }
            return Err(e.into());
        }
    };
    match (&targets, &scanner) {
        (None, None) => tracing::info!(
            "sampling every process on {} CPUs on {} at {sampling}",
            sampler.cpus(),
            event.name,
        ),
        (None, Some(s)) => {
            tracing::info!(
                "sampling targets {} ({} now) on {} at {sampling}",
                describe_specs(s.specs()),
                crate::service::targets::describe_pids(initial.as_deref().unwrap_or_default()),
                event.name,
            );
            crate::service::targets::warn_unmatchable(s.specs());
        }
        (Some(t), _) => tracing::info!(
            "sampling {} on {} at {sampling}",
            crate::service::targets::describe_pids(t),
            event.name
        ),
    }
    // Release the command; with bursts, unless --no-hold, the attach
    // thread releases it once it traces it (to hold it at its entry).
    let static_targets = child.is_some() || !cli.pids.is_empty();
    // The service (configured targets, or a file whose reload may add
    // some) traces its targets in bursts as they appear; sampling every
    // process never does.
    let service_bursts = !static_targets && (scanner.is_some() || settings.source.is_some());
    if !static_targets && (args.full_trace || args.save_bursts) {
        anyhow::bail!(
            "{} needs --pid or run: the service traces its targets in short bursts only",
            if args.full_trace {
                "--full-trace"
            } else {
                "--save-bursts"
            }
        );
    }
    let bursts_on = settings.bursts.enabled && static_targets || service_bursts;
    let hold = matches!(cli.command, Some(Command::Run { no_hold: false, .. })) && bursts_on;
    if bursts_on {
        crate::bursts::cache::init(
            (!args.no_cache)
                .then(|| {
                    args.cache_dir
                        .clone()
                        .or_else(crate::bursts::cache::default_dir)
                })
                .flatten(),
            args.cache_max_mb,
        );
    }
    let gate = gate.take().filter(|_| hold);
    let ended = session::run(
        SessionOptions {
            event,
            requested_event,
            sampling,
            targets,
            duration,
            interval,
            output: settings.output.clone(),
            gate,
            bursts: bursts_on.then(|| {
                settings.bursts.options(
                    args.full_trace,
                    args.save_bursts
                        .then(|| settings.output.join("bursts.jsonl")),
                )
            }),
            service: session::Service {
                scanner,
                reload: source.map(|source| session::Reload {
                    source,
                    overrides,
                    static_targets,
                }),
                settings,
            },
        },
        sampler,
        child.map(|(c, report)| session::Command::new(c, Some(report))),
    )
    .await;
    let Some(command) = ended.command else {
        ended.result?;
        return Ok(0);
    };
    // `run`: the command's status, whatever became of the profile.
    if let Err(e) = &ended.result {
        eprintln!("burstyd: error: {}", error_chain(e));
    }
    let status = command?;
    if ended.result.is_err() {
        eprintln!("burstyd: the command ended ({status}); burstyd exits with its status");
    }
    Ok(exit_code(status))
}

/// A command's exit status as a shell reports it: its code, or 128 plus
/// the signal that killed it.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

fn describe_specs(specs: &[crate::service::config::TargetSpec]) -> String {
    specs
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks the kernel features burstyd needs, so that their absence is
/// reported as such rather than as an obscure load error.
fn preflight() -> anyhow::Result<()> {
    if !std::path::Path::new("/proc/sys/kernel/perf_event_paranoid").exists() {
        bail!("this kernel has no perf events support (CONFIG_PERF_EVENTS)");
    }
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        bail!(
            "this kernel has no BTF (/sys/kernel/btf/vmlinux is missing; CONFIG_DEBUG_INFO_BTF): burstyd's eBPF program needs it"
        );
    }
    Ok(())
}

/// Environment variable that turns `burstyd` into the exec gate of
/// `burstyd run` (see [`spawn_gated`]); its value is the pipe's read fd.
const GATE_ENV: &str = "__BURSTYD_EXEC_GATE";
/// The gate's report pipe (write end): a failed exec writes its errno
/// there; a successful one closes it (close-on-exec).
const REPORT_ENV: &str = "__BURSTYD_EXEC_REPORT";

/// In the gate process: waits until burstyd closes the pipe, then execs the
/// command in place (same pid). Never returns on success.
fn exec_gate(fd: &str, argv: &[std::ffi::OsString]) -> ! {
    let fd: i32 = fd.parse().unwrap_or(-1);
    let mut b = 0u8;
    // SAFETY: reading one byte into a valid buffer; EOF (0) means go.
    while unsafe { libc::read(fd, &mut b as *mut u8 as *mut libc::c_void, 1) } < 0
        && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
    {}
    let report: i32 = std::env::var(REPORT_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1);
    // SAFETY: single-threaded at this point; we exec right after.
    unsafe {
        libc::close(fd);
        std::env::remove_var(GATE_ENV);
        std::env::remove_var(REPORT_ENV);
        if report >= 0 {
            libc::fcntl(report, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
    let err = std::process::Command::new(&argv[0]).args(&argv[1..]).exec();
    eprintln!("burstyd: cannot run `{}`: {err}", argv[0].to_string_lossy());
    if report >= 0 {
        let code = err.raw_os_error().unwrap_or(0).to_ne_bytes();
        // SAFETY: writing 4 bytes from a valid buffer to our own pipe.
        unsafe { libc::write(report, code.as_ptr().cast(), code.len()) };
    }
    // As a shell: 127 for a command not found, 126 for one not runnable.
    let code = if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    std::process::exit(code);
}

/// Spawns `command` so that it does not start before the returned fd (the
/// write end of a pipe) is closed: the child first runs this binary as a
/// gate, which waits on the pipe and then execs `command` in place, keeping
/// its pid. (Blocking in `pre_exec` instead would deadlock: `spawn` waits
/// for the exec.)
fn spawn_gated(command: &[String]) -> anyhow::Result<(tokio::process::Child, OwnedFd, OwnedFd)> {
    let pipe = |flags: i32| -> anyhow::Result<(OwnedFd, OwnedFd)> {
        let mut fds = [0i32; 2];
        // SAFETY: `fds` is a valid out-array of two ints.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | flags) } != 0 {
            return Err(std::io::Error::last_os_error()).context("pipe2");
        }
        // SAFETY: pipe2 just returned these two descriptors; we own them.
        Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
    };
    let (read_end, write_end) = pipe(0)?;
    // Read without blocking once the command has ended.
    let (report_read, report_write) = pipe(libc::O_NONBLOCK)?;
    let rfd = read_end.as_raw_fd();
    let wfd = write_end.as_raw_fd();
    let report_rfd = report_read.as_raw_fd();
    let report_wfd = report_write.as_raw_fd();
    let exe = std::env::current_exe().context("finding burstyd's own executable")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(command)
        .env(GATE_ENV, rfd.to_string())
        .env(REPORT_ENV, report_wfd.to_string());
    // The command starts with the signal mask burstyd was given, not the
    // one that holds the session's signals back.
    let mask = crate::sys::original_sigmask();
    // SAFETY: only async-signal-safe calls (close, fcntl, sigprocmask)
    // between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::close(wfd);
            libc::close(report_rfd);
            crate::sys::set_sigmask(&mask)?;
            // Keep the gate's read end and the report's write end open
            // across the exec into the gate.
            for fd in [rfd, report_wfd] {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = tokio::process::Command::from(cmd)
        .spawn()
        .with_context(|| format!("cannot run `{}`", command[0]))?;
    drop(read_end);
    drop(report_write);
    Ok((child, write_end, report_read))
}

#[cfg(test)]
mod tests {
    #[test]
    fn error_chain_drops_a_cause_its_parent_already_printed() {
        let io = std::io::Error::from_raw_os_error(libc::EINVAL);
        let e = anyhow::Error::new(io)
            .context("`perf_event_open` failed")
            .context("opening the cpu-clock sampling event on CPU 0: `perf_event_open` failed");
        assert_eq!(
            super::error_chain(&e),
            "opening the cpu-clock sampling event on CPU 0: `perf_event_open` failed: Invalid argument (os error 22)"
        );
        let e = anyhow::anyhow!("disk full").context("writing x");
        assert_eq!(super::error_chain(&e), "writing x: disk full");
    }
}
